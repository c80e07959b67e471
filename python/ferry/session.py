"""The Client's session with its agent, and surviving the agent's restart.

A session lives as long as the agent run that opened it: when ferryd restarts (or dies and
comes back on the same socket), its buffers, registrations and block lists are gone, and the
new run knows nothing of the old session (it refuses calls naming it). The Client's calls go
through a Session here, which notices that the agent went away (the session's call ended, or a
call failed the way a vanished agent makes it fail), opens a new session (waiting up to the
client's timeout for the agent to be back) and raises ferry.AgentRestarted once, saying what
was lost. Objects of the old session (Registration, BlockList, Handle, Buffer) then refuse to
be used at once, with a message that says why, rather than each call failing its own way
(the new run counts its ids from its own start, so old ids name nothing there).
"""

import threading
import time
import weakref

from . import _ferry
from .errors import AgentRestarted, Error, FailedPrecondition, Unavailable

def _looks_gone(error):
    """Whether `error` may mean the agent went away: gRPC's UNAVAILABLE (the transfer
    socket's broken pipe too), or a new run of the agent refusing the old session's id."""
    if error.code == Unavailable.code:
        return True
    return error.code == FailedPrecondition.code and "is not open" in str(error.message)


class Session:
    """A _ferry.Session that knows when its agent restarted. Attribute access gives the
    compiled session's methods, each checking first that the session is still the client's
    current one (FailedPrecondition otherwise) and that its agent is still there (else the
    client reconnects and AgentRestarted is raised)."""

    def __init__(self, raw, owner):
        self.raw = raw
        self._owner = weakref.ref(owner)  # the Client's _Reconnect
        self._stale = None  # why this session may no longer be used, once it is not current
        # What the session holds, for AgentRestarted.lost (collected objects drop out).
        self._regs = weakref.WeakSet()
        self._lists = weakref.WeakSet()
        self._buffers = weakref.WeakValueDictionary()

    def track(self, kind, obj):
        """Counts `obj` (a Registration, BlockList or _ferry.Buffer) as this session's."""
        if kind == "registrations":
            self._regs.add(obj)
        elif kind == "lists":
            self._lists.add(obj)
        else:
            self._buffers[obj.id] = obj

    def lost(self):
        regs = [r.name or r.id for r in list(self._regs) if r.owned]
        lists = [bl.name or bl.id for bl in list(self._lists) if bl.id]
        buffers = sorted(self._buffers.keys())
        return {"registrations": regs, "lists": lists, "buffers": buffers}

    def check(self, what="this object"):
        """FailedPrecondition if the session is an old agent run's; AgentRestarted (once) if
        its agent went away since the last call."""
        if self._stale is not None:
            raise FailedPrecondition(f"{what}: {self._stale}")
        if not self.raw.alive:
            owner = self._owner()
            if owner is not None:
                owner.restarted(self, None)

    def __getattr__(self, name):
        attr = getattr(self.raw, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.check()
            try:
                return attr(*args, **kwargs)
            except Error as e:
                owner = self._owner()
                if owner is not None and _looks_gone(e):
                    owner.restarted(self, e)  # raises AgentRestarted if it did
                raise
        return call


class Reconnect:
    """The Client's current Session, replaced by a new one when the agent restarted."""

    def __init__(self, target, timeout):
        self.target = target
        self.timeout = timeout
        self._lock = threading.Lock()
        self.current = Session(_ferry.Session(target, timeout), self)

    def restarted(self, session, error):
        """Called when `session`'s agent may have gone (`error`: the failure that suggests
        it; None: the session's call ended). Returns if it did not (the caller re-raises
        `error`); raises AgentRestarted once the client runs on a new session, or
        Unavailable when no agent came back within the client's timeout."""
        with self._lock:
            if session is not self.current:
                # Another thread's call found the restart first and raised AgentRestarted;
                # this one ran on the old session meanwhile. Trying again works.
                raise Unavailable(f"ferryd at {self.target} restarted while this call ran on "
                                  f"its old session (another call raised AgentRestarted); the "
                                  f"client runs on a new session now")
            old = session.raw
            if error is not None and old.alive:
                # The agent may still be the one that opened the session (a refusal, or an
                # UNAVAILABLE of its own): only another run of it means a restart.
                try:
                    info = old.info()
                except Error:
                    info = None
                if info is not None and info["incarnation"] == old.incarnation:
                    return
            ended = old.ended or (str(error.message) if error is not None else "")
            deadline = time.monotonic() + self.timeout
            try:
                new = _ferry.Session(self.target, self.timeout)
            except Error as e:
                left = max(deadline - time.monotonic(), 0)
                raise Unavailable(f"ferryd at {self.target} went away (session {old.id} ended: "
                                  f"{ended}) and no agent opened a new session within "
                                  f"{self.timeout - left:.3g} s: {e.message}") from None
            if new.incarnation == old.incarnation and old.alive:
                return  # the same run answered: not a restart
            lost = session.lost()
            started = (time.time() * 1000 - new.started_unix_ms) / 1000
            session._stale = (f"it belonged to session {old.id} of ferryd at {self.target}, "
                              f"which restarted; register or prepare it again")
            self.current = Session(new, self)
        held = "; ".join(f"{len(v)} {k} {v}" for k, v in lost.items())
        raise AgentRestarted(
            f"ferryd at {self.target} restarted {max(started, 0):.0f} s ago (incarnation "
            f"{old.incarnation:x} -> {new.incarnation:x}): session {old.id} ended ({ended}), "
            f"and what it held is lost ({held}); this client runs on a new session now: "
            f"register and prepare again what you need", lost=lost)


def _deregister_quietly(raw, ident):
    try:
        raw.deregister(ident)
    except Error:
        pass  # the session (or the agent) is gone, and the registration with it


def end_with(registration, raw):
    """Ends `registration` (one a call made for itself, e.g. a CUDA tensor's for a send) in
    session `raw` once the Registration object is collected: when the call that keeps it
    ended, on whichever thread dropped it last."""
    weakref.finalize(registration, _deregister_quietly, raw, registration.id)
