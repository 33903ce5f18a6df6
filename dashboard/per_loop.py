"""One object per event loop (this process's, in the server; each test's own), made on first use."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    def __init__(self, make: Callable[[], T]) -> None:
        self.make = make
        self.made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        if loop not in self.made:
            self.made[loop] = self.make()
        return self.made[loop]
