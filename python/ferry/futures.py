"""ferry.Future, the result of a Client's _async call, and the thread that completes them."""

import atexit
import concurrent.futures
import itertools
import threading
import weakref

from . import _ferry
from .errors import FailedPrecondition


class Future:
    """The result of an _async call. cancel() cancels the call at the agent, even running.

    No thread waits for the call: gRPC reports its end and the client's completer thread
    completes the future, running add_done_callback functions there (keep them short, they
    hold up the other futures)."""

    def __init__(self):
        self._future = concurrent.futures.Future()
        # Running from the start: cancel() is the agent's business, not an executor's.
        self._future.set_running_or_notify_cancel()
        self._call = None  # _ferry.Call, until the future is complete
        self._finish = None  # the blocking call's result from the Call's
        self._keep = None  # what must live until the call ends (the tensor, a staging buffer)

    def result(self, timeout=None):
        return self._future.result(timeout)

    def exception(self, timeout=None):
        return self._future.exception(timeout)

    def done(self):
        return self._future.done()

    def add_done_callback(self, fn):
        self._future.add_done_callback(lambda _: fn(self))

    def cancel(self):
        """Cancels the call; True unless it had already finished. The future then ends with
        ferry.Cancelled (or its result, if the call had just completed)."""
        call = self._call
        if call is None or self._future.done():
            return False
        call.cancel()
        return True

    def _attach(self, started):
        self._call, self._finish, self._keep = started

    def _fail(self, error):
        self._future.set_exception(error)

    def _complete(self):
        """Called once the call ended (call.result() does not wait then)."""
        try:
            value = self._finish(self._call.result())
        except BaseException as e:  # noqa: B902 - the future carries whatever it raised
            self._future.set_exception(e)
        else:
            self._future.set_result(value)
        # After the result is set: cancel() reads _call to know the future is not done.
        self._call = self._finish = self._keep = None


class _Completer:
    """One thread per client that completes its futures: gRPC pushes the key of each call
    that ended to a _ferry.Completions queue, and this thread takes them from it."""

    def __init__(self):
        self.queue = _ferry.Completions()
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._futures = {}  # key -> Future whose call is running
        self._early = set()  # keys of calls that ended before their future was tracked
        self._thread = None
        self._closed = False
        self._orphaned = False  # the client was collected: end once nothing is outstanding

    def key(self):
        """A key for a call about to start; starts the thread on first use."""
        with self._lock:
            if self._closed:
                raise FailedPrecondition("client: closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ferry-completer",
                                                daemon=True)
                self._thread.start()
                _completers.add(self)
            return next(self._keys)

    def track(self, key, future):
        """From the caller, once the call started: its end may have been reported already."""
        with self._lock:
            ended = key in self._early
            if ended:
                self._early.discard(key)
            else:
                self._futures[key] = future
        if ended:
            future._complete()

    def _run(self):
        while True:
            keys = self.queue.next()  # the GIL released while it waits
            if not keys:
                return
            for key in keys:
                self._ended(key)
            with self._lock:
                if self._orphaned and not self._futures:
                    return

    def _ended(self, key):
        # A method of its own: a local of _run would keep the last future (and a received
        # buffer) alive until the next call ends.
        with self._lock:
            future = self._futures.pop(key, None)
            if future is None:
                self._early.add(key)
        if future is not None:
            future._complete()

    def orphan(self):
        """The client is gone: the thread ends once its last future completed (futures
        outlive their client)."""
        with self._lock:
            self._orphaned = True
            idle = not self._futures
        if idle:
            self.queue.close()

    def close(self, wait=True):
        """Stops the thread; with `wait`, once every outstanding future completed."""
        with self._lock:
            self._closed = True
            pending = [f._future for f in self._futures.values()]
            thread = self._thread
        if wait and pending:
            concurrent.futures.wait(pending)
        self.queue.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=None if wait else 1.0)


# At exit, before the interpreter stops its threads: a completer thread must not be woken
# into a finalizing interpreter.
_completers = weakref.WeakSet()


@atexit.register
def _stop_completers():
    for completer in list(_completers):
        completer.close(wait=False)
