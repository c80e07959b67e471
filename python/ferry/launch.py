"""Starts real ferryd agents for examples and tests, and always stops them.

    with ferry.launch.agents(["rank0", "rank1"]) as nodes:
        c0 = ferry.Client(nodes["rank0"].socket)

Each agent gets a generated config (its node name, a socket and a free loopback port, every
other agent as a peer) in a temporary folder. The agents talk mutual TLS, as deployed ones
do: a throwaway CA in that folder signs a certificate for each node (the `openssl`
command; the C++ launcher does the same, client/dev_pki.h). The ferryd binary is $FERRYD,
else `ferryd` on PATH.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


class Agent:
    def __init__(self, node, folder, port):
        self.node = node
        self.socket = os.path.join(folder, f"{node}.sock")
        self.peer_address = f"127.0.0.1:{port}"
        self.config = os.path.join(folder, f"{node}.yaml")
        self.log = os.path.join(folder, f"{node}.log")
        self.process = None

    def log_text(self):
        try:
            with open(self.log) as f:
                return f.read()
        except OSError:
            return ""


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ferryd():
    path = os.environ.get("FERRYD") or shutil.which("ferryd")
    if not path:
        raise FileNotFoundError("ferryd not found: set $FERRYD to the agent binary")
    return path


def _stop(agent, grace=5.0):
    p = agent.process
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _openssl(*args):
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr[-500:]}")


def _dev_certificates(folder, nodes):
    """A CA in `folder` and a certificate per node (DNS subjectAltName = the node name);
    returns {node: the `security` section of its config}. P-256 keys: made in milliseconds."""
    ca, ca_key = os.path.join(folder, "ca.pem"), os.path.join(folder, "ca.key")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "7",
             "-subj", "/CN=ferry-py CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    sections = {}
    for n in nodes:
        stem = os.path.join(folder, n)
        with open(stem + ".ext", "w") as f:
            f.write(f"subjectAltName=DNS:{n}\nextendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", "-new", *ec, "-keyout", stem + ".key", "-out", stem + ".csr",
                 "-subj", f"/CN={n}")
        _openssl("x509", "-req", "-in", stem + ".csr", "-CA", ca, "-CAkey", ca_key,
                 "-CAcreateserial", "-days", "7", "-extfile", stem + ".ext", "-out", stem + ".pem")
        sections[n] = (f"security:\n  mode: mtls\n  ca: {ca}\n  cert: {stem}.pem\n"
                       f"  key: {stem}.key\n")
    return sections


@contextlib.contextmanager
def agents(nodes, host_pool="1GiB", timeout=15.0, extra="", local_mode=""):
    """Yields {node: Agent} with every agent serving; stops them all on the way out. `extra`:
    more YAML for every agent's config (e.g. simulated GPUs). `local_mode`: the local
    sockets' mode (listen.local_mode, e.g. "0666" for clients of other uids)."""
    folder = tempfile.mkdtemp(prefix="ferry-py-")
    started = {}
    try:
        ports = {n: _free_port() for n in nodes}
        security = _dev_certificates(folder, nodes)
        for n in nodes:
            a = Agent(n, folder, ports[n])
            with open(a.config, "w") as f:
                f.write(f"node: {n}\nlisten:\n  local: {a.socket}\n  peer: {a.peer_address}\n")
                if local_mode:
                    f.write(f"  local_mode: \"{local_mode}\"\n")
                others = [m for m in nodes if m != n]
                if others:
                    f.write("peers:\n")
                    for m in others:
                        f.write(f"  {m}: 127.0.0.1:{ports[m]}\n")
                f.write(f"host_pool:\n  size: {host_pool}\n")
                f.write(extra)
                f.write(security[n])
            with open(a.log, "w") as log:
                a.process = subprocess.Popen([_ferryd(), "--config", a.config], stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            started[n] = a
        deadline = time.monotonic() + timeout
        for a in started.values():
            while not os.path.exists(a.socket):
                if a.process.poll() is not None:
                    raise RuntimeError(f"ferryd {a.node} exited at start:\n{a.log_text()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ferryd {a.node} did not start; log: {a.log}")
                time.sleep(0.02)
        yield started
    finally:
        for a in started.values():
            _stop(a)
        shutil.rmtree(folder, ignore_errors=True)
