"""The fake kernels' flag waits: a sleeper wakes when a peer writes its word and wakes it."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from fakes import futex

needs_futex = pytest.mark.skipif(not futex.AVAILABLE, reason="futex: Linux on x86-64 only")


@needs_futex
def test_futex_wait_returns_when_the_word_changes():
    word = torch.zeros(1, dtype=torch.int32)
    started = time.monotonic()
    futex.wait(word, 1, 30.0)  # it holds 0, not 1: no sleep at all
    writer = threading.Thread(target=lambda: (word.fill_(1), futex.wake([word.data_ptr()])))
    writer.start()
    while int(word) == 0:
        futex.wait(word, 0, 30.0)
    writer.join()
    assert time.monotonic() - started < 10.0  # woken, not timed out


@needs_futex
def test_futex_wait_is_bounded_by_its_timeout():
    word = torch.zeros(1, dtype=torch.int32)
    started = time.monotonic()
    futex.wait(word, 0, 0.05)  # nobody writes: back after the timeout
    assert time.monotonic() - started < 10.0
    assert int(word) == 0


def test_futex_without_the_call_waits_are_short_sleeps(monkeypatch):
    monkeypatch.setattr(futex, "AVAILABLE", False)
    word = torch.zeros(1, dtype=torch.int32)
    started = time.monotonic()
    futex.wait(word, 0, 30.0)  # unchanged word: a short sleep, not 30 s
    assert time.monotonic() - started < 10.0
    futex.wake([0])  # no call made (address 0 would fault)
