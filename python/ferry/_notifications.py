"""Notifications: what a batch delivers to the peer's agent once it landed, and the Client
calls that take them (wait, poll, stream) or send one alone (notify)."""

import collections

from ._calls import _seconds
from .errors import InvalidArgument

# A notification: `payload` is what the sender gave with it (notify_payload; b"" when none),
# `code` and `message` how its batch went (0: it landed), `list` / `buffer` what it landed in.
Notification = collections.namedtuple(
    "Notification", "name from_node bytes blocks sequence code message list buffer payload",
    defaults=(0, "", "", "", b""))
# What a notification may carry (notify_payload), as the agent allows.
MAX_NOTIFY_PAYLOAD = 4096


def _payload(notify_payload, notify):
    """notify_payload as bytes, checked here as the agent would (InvalidArgument naming it)."""
    payload = bytes(notify_payload or b"")
    if len(payload) > MAX_NOTIFY_PAYLOAD:
        raise InvalidArgument(f"notify_payload: {len(payload)} bytes is more than "
                              f"{MAX_NOTIFY_PAYLOAD}")
    if payload and not notify:
        raise InvalidArgument("notify_payload: a payload travels with a notification; name one "
                              "(notify=...)")
    return payload


class _NotificationCalls:
    """Client's notification calls."""

    def wait_notification(self, name, from_node="", timeout=60.0):
        """Takes notification `name` (waiting up to `timeout` seconds; 0 or less: a poll,
        answered at once: the notification, or DeadlineExceeded when it is not there; None:
        no limit). A batch that failed raises."""
        return self._wait(self._start_wait_notification(name, from_node, timeout))

    def _start_wait_notification(self, name, from_node="", timeout=60.0, _ended=()):
        call = self._s.wait_notification(name, from_node, _seconds(timeout), *_ended)
        return call, lambda n: Notification(**n), None

    def poll_notifications(self, prefix="", max_count=0):
        """Takes every pending notification whose name starts with `prefix` (at most
        `max_count`; 0: all), oldest first, and returns them as a list at once: [] when none
        is there. Never waits: a connector's drain each engine step (one round trip over the
        agent's transfer socket where the client reaches it). Notifications of batches that
        failed come as they are (`code`, `message`), not raised."""
        out = []
        while True:
            want = max_count - len(out) if max_count else 0
            got, more = self._s.poll_notifications(prefix, want)
            out.extend(Notification(**n) for n in got)
            if not more or (max_count and len(out) >= max_count):
                return out

    def notifications(self, prefix="", timeout=None, max_count=0):
        """Yields notifications whose name starts with `prefix` until `timeout` seconds
        (None: until the generator is closed; 0 or less: those pending now, then it ends, as
        poll_notifications) or `max_count` of them."""
        if timeout is not None and timeout <= 0:
            yield from self.poll_notifications(prefix, max_count)
            return
        stream = self._s.open_notifications(prefix, float(timeout or 0), int(max_count))
        try:
            while True:
                n = stream.next()
                if n is None:
                    return
                yield Notification(**n)
        finally:
            stream.cancel()

    def notify(self, peer, remote_list_name, name, payload=b"", timeout=10.0):
        """Delivers notification `name` with `payload` (bytes, at most 4096) to the owner of
        `peer`'s exported list `remote_list_name`, with no move (NIXL's send_notif): it
        arrives in their poll_notifications as a move's would (`list` set, no blocks, no
        bytes). Returns once the peer's agent has it; NotFound for a list the peer does not
        have (or does not let this node reach), DeadlineExceeded naming the peer when it did
        not answer within `timeout` seconds, Unavailable when it could not be reached."""
        self._s.notify(peer, remote_list_name, name, _payload(payload, name), float(timeout))

    def wait_notification_async(self, name, **kwargs):
        return self._async(self._start_wait_notification, name, **kwargs)
