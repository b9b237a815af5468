"""The waiting queue's order, shared by every engine family: priority classes, highest first,
arrival order within a class (SGLang's priority scheduling; FCFS when every priority is 0, the
default), and where a preempted request re-enters it (the family's rule: `Rules.requeue`)."""

from __future__ import annotations

from collections import deque

from aprilsim.engine.request import Request


def enqueue(waiting: deque[Request], reqs: list[Request]) -> None:
    """Queue `reqs` behind every waiting request of equal or higher priority (SGLang's priority
    scheduling: higher priority first, arrival order among equals). Without priorities (all 0,
    the default) this is a plain append: FCFS."""
    if not reqs:
        return
    p = reqs[0].priority
    if (not waiting or waiting[-1].priority >= p) and all(r.priority == p for r in reqs):
        waiting.extend(reqs)
        return
    for r in reqs:
        _insert(waiting, r, head=False)


def requeue(waiting: deque[Request], victims: list[Request], head: bool) -> None:
    """Put retracted requests back: at the head of the queue (in reverse eviction order, as
    SGLang's `extendleft`) or at its tail; with priorities, at the head or tail of their own
    priority class, so a retraction never moves work ahead of higher-priority requests."""
    # the queue is ordered by priority: its head and tail bound every priority in it
    if not any(r.priority for r in victims) and (
            not waiting or not waiting[0].priority and not waiting[-1].priority):
        if head:
            waiting.extendleft(victims)
        else:
            waiting.extend(victims)
        return
    for r in victims:
        _insert(waiting, r, head)


def _insert(waiting: deque[Request], r: Request, head: bool) -> None:
    """Insert `r` at the head (before its first equal) or the tail (after its last equal) of its
    priority class in a queue ordered by priority, highest first."""
    p = r.priority
    for i, q in enumerate(waiting):
        if q.priority < p or (head and q.priority == p):
            waiting.insert(i, r)
            return
    waiting.append(r)
