"""How a Client call runs: started, then waited on or handed to a Future.

Each call has a _start_* half that starts it and returns (call, finish, keep): the
_ferry.Call, the function that makes the blocking form's result from call.result(), and
what must live until the call ended. The blocking form waits on the call (Ctrl-C cancels
it); the _async form hands the three to a Future. `_ended`: (Completions, key) of a future,
or () for a blocking call."""

from .futures import Future


def _seconds(timeout):
    """A timeout for _ferry: seconds as a float, or None (no limit)."""
    return None if timeout is None else float(timeout)


def _same(result):
    return result


class _Calls:
    """The Client's blocking and _async forms of its _start_* calls."""

    @staticmethod
    def _wait(started):
        call, finish, _keep = started  # `_keep` lives in this frame until the call ended
        return finish(call.result())

    def _async(self, start, *args, **kwargs):
        future = Future()
        key = self._completer.key()
        try:
            started = start(*args, _ended=(self._completer.queue, key), **kwargs)
        except Exception as e:  # noqa: B902 - bad input fails the future, as a failed call does
            future._fail(e)
            return future
        future._attach(started)
        self._completer.track(key, future)
        return future
