#!/usr/bin/env python3
"""ferryctl's offline behaviour that needs no agent: a usage mistake is a line and a hint,
a missing socket is named at once (exit 3), and `certs` makes a CA and node certificates that
openssl verifies, with the node's name as DNS subjectAltName, refusing to overwrite.

Usage: ferryctl_cli_test.py FERRYCTL
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

FERRYCTL = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/client/ferryctl")
failures = []


def run(*args, cwd=None, env=None):
    p = subprocess.run([FERRYCTL, *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def expect(cond, what, detail=""):
    if not cond:
        failures.append(f"{what}\n{detail}")
        print(f"FAIL: {what}\n{detail}")


def openssl(*args):
    p = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def test_usage_mistakes_are_one_line_and_a_hint():
    rc, out, err = run("infoo")
    expect(rc == 2, "unknown command exits 2", err)
    lines = err.strip().splitlines()
    expect(len(lines) == 2, "unknown command: two lines, not the usage", err)
    expect("unknown command 'infoo' (did you mean 'info'?)" in err, "suggests info", err)
    expect("ferryctl --help" in err, "points at --help", err)
    rc, out, err = run("frobnicate")
    expect(rc == 2 and "did you mean" not in err, "no suggestion for a far word", err)
    rc, out, err = run("--help")
    expect(rc == 0 and "certs ca --out DIR" in out, "--help lists certs", out)
    # put and get take --timeout (a duration); their default deadline grows with the size.
    expect("--timeout DURATION" in out and "1 s per 16 MiB" in out, "--help names --timeout", out)
    rc, out, err = run("put", "x.bin", "--to", "node-b:kv", "--timeout", "soon")
    expect(rc == 2 and "--timeout needs a duration like 90s or 5m" in err,
           "a --timeout that is no duration is a usage error", err)


def test_a_missing_socket_is_named_at_once(tmp):
    env = dict(os.environ, FERRY_SOCKET=os.path.join(tmp, "ferryd-nobody.sock"))
    start = time.monotonic()
    rc, out, err = run("info", env=env)
    took = time.monotonic() - start
    expect(rc == 3, "no agent: exit 3", err)
    expect(took < 2.0, f"no agent: answered at once (took {took:.1f} s)")
    expect(f"no ferryd socket at {tmp}/ferryd-nobody.sock (no such file)" in err,
           "names the socket", err)
    expect("--socket PATH" in err and "FERRY_SOCKET" in err, "says how to point at one", err)


def test_certs(tmp):
    rc, out, err = run("certs", "ca", "--out", "ca", cwd=tmp)
    expect(rc == 0, "certs ca", err)
    expect(oct(os.stat(f"{tmp}/ca/ca.key").st_mode & 0o777) == "0o600", "CA key is 0600")
    rc, out, err = run("certs", "node", "node-b", "--ca", "ca", "--out", "tls-node-b",
                       "--days", "30", cwd=tmp)
    expect(rc == 0, "certs node", err)
    d = f"{tmp}/tls-node-b"
    expect(sorted(os.listdir(d)) == ["ca.crt", "tls.crt", "tls.key"], "node folder",
           str(os.listdir(d)))
    expect(oct(os.stat(f"{d}/tls.key").st_mode & 0o777) == "0o600", "node key is 0600")
    expect(f"security: {{mode: mtls, ca: {d}/ca.crt, cert: {d}/tls.crt, key: {d}/tls.key}}"
           in out, "prints the security section with absolute paths", out)
    rc, text = openssl("verify", "-CAfile", f"{d}/ca.crt", f"{d}/tls.crt")
    expect(rc == 0, "openssl verifies the node certificate against ca.crt", text)
    rc, text = openssl("x509", "-in", f"{d}/tls.crt", "-noout", "-text")
    expect("DNS:node-b" in text, "SAN names the node", text)
    expect("TLS Web Server Authentication, TLS Web Client Authentication" in text,
           "server and client use", text)
    # A second node of the same CA has another serial.
    run("certs", "node", "node-c", "--ca", "ca", "--out", "tls-node-c", cwd=tmp)
    _, b = openssl("x509", "-in", f"{d}/tls.crt", "-noout", "-serial")
    _, c = openssl("x509", "-in", f"{tmp}/tls-node-c/tls.crt", "-noout", "-serial")
    expect(b != c, "serials differ", b + c)

    # Nothing is overwritten; mistakes name what is wrong.
    before = open(f"{tmp}/ca/ca.pem").read()
    rc, out, err = run("certs", "ca", "--out", "ca", cwd=tmp)
    expect(rc == 1 and "ca/ca.pem exists" in err, "a second CA is refused", err)
    expect(open(f"{tmp}/ca/ca.pem").read() == before, "the CA is kept")
    rc, out, err = run("certs", "node", "node-b", "--ca", "ca", "--out", "tls-node-b", cwd=tmp)
    expect(rc == 1 and "tls-node-b/tls.crt exists" in err, "a second node cert is refused", err)
    rc, out, err = run("certs", "node", "a,IP:1.2.3.4", "--ca", "ca", "--out", "x", cwd=tmp)
    expect(rc == 1 and "DNS name" in err and not os.path.exists(f"{tmp}/x"),
           "a name that is not a DNS name is refused before anything is made", err)
    rc, out, err = run("certs", "node", "n", "--ca", "nowhere", "--out", "y", cwd=tmp)
    expect(rc == 1 and "no CA there" in err, "a missing CA is named", err)
    rc, out, err = run("certs", "node", "n", "--out", "y", cwd=tmp)
    expect(rc == 2 and "--ca DIR" in err, "certs node needs --ca", err)
    rc, out, err = run("certs", cwd=tmp)
    expect(rc == 2 and "certs needs ca or node" in err, "certs alone is a usage error", err)


def main():
    if shutil.which("openssl") is None:
        print("SKIP: openssl is not installed (apt-get install openssl)")
        return 0
    tmp = tempfile.mkdtemp(prefix="ferryctl_cli_test.")
    try:
        test_usage_mistakes_are_one_line_and_a_hint()
        test_a_missing_socket_is_named_at_once(tmp)
        test_certs(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
