"""Per-worker provider health: down after retries run out, up again after one successful probe call."""

from __future__ import annotations

import asyncio
import time


class ProviderHealth:
    """While a provider is down, one waiting task at a time probes it with its real call.

    The others wait for the probe to succeed; they do not call the provider, so a
    provider that comes back is not hit by every held task at once.
    """

    def __init__(self, name: str, probe_interval: float) -> None:
        self.name = name
        self.probe_interval = probe_interval
        self.down_since: float | None = None
        self.reason: str = ""
        self._up = asyncio.Event()
        self._up.set()
        self._probing = False

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    def mark_down(self, reason: str) -> bool:
        """Returns True on the transition up → down."""
        self.reason = reason
        if self.down_since is not None:
            return False
        self.down_since = time.time()
        self._up.clear()
        return True

    def mark_up(self) -> bool:
        """Returns True on the transition down → up."""
        if self.down_since is None:
            return False
        self.down_since = None
        self.reason = ""
        self._up.set()
        return True

    async def wait_turn(self) -> bool:
        """Block while the provider is down; True means "you are the probe: call now".

        The caller that gets True must call ``probe_done`` when its attempt ends.
        """
        while self.is_down:
            if not self._probing:
                self._probing = True
                try:
                    await asyncio.wait_for(self._up.wait(), timeout=self.probe_interval)
                except asyncio.TimeoutError:
                    return True
                except BaseException:
                    self._probing = False
                    raise
                self._probing = False
                return False
            try:
                await asyncio.wait_for(self._up.wait(), timeout=self.probe_interval)
            except asyncio.TimeoutError:
                pass
        return False

    def probe_done(self) -> None:
        self._probing = False
