"""What a run of an output path tells its journal, and how a later run finds and judges it.

A run's fingerprint (:func:`fingerprint`) holds what it computes and from what: its inputs'
signatures (:func:`~oocgemm.lifecycle.journal.signature`), the problem, the output and its
layout; its schedule key (:func:`schedule_key`) what fixes the order of every block's sums.
:func:`resumable` finds the interrupted run of the same product (same fingerprint and key:
then the blocks it journaled are bitwise what this run would compute) and says in words what
changed when there is none. :func:`warn_kept` and :func:`name_left_behind` tell the user
about the temporary outputs of other runs; nothing here removes them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable

from ..backends import backend_of
from ..errors import BudgetError, OutputError
from ..planning import Plan
from ..planning.planner import replan
from ..storage import is_path, urls
from . import journal as journals


def signatures(out, inputs: dict, known: dict | None = None) -> dict | None:
    """Each input's signature (``inputs``: role -> what the user passed), for a run's journal;
    None where the run cannot be resumed: an output that is not a local path, or an input
    that is not a local file or folder. ``known``: the signatures taken already
    (:func:`local_signatures` of the same inputs)."""
    if not is_path(out) or urls.is_url(os.fspath(out)):
        return None
    found = local_signatures(inputs) if known is None else known
    return found if set(found) == set(inputs) else None


def local_signatures(inputs: dict) -> dict:
    """The signatures of the ``inputs`` (role -> what the user passed) that are local files
    or folders (:func:`~oocgemm.lifecycle.journal.signature`: their stat, nothing read); an
    input that is no longer there signs as ``'missing'``. Arrays and URLs are left out."""
    found = {}
    for role, x in inputs.items():
        if not is_path(x) or urls.is_url(urls.local(os.fspath(x))):
            continue
        try:
            found[role] = journals.signature(urls.local(os.fspath(x)))
        except FileNotFoundError:
            found[role] = "missing"
    return found


def not_resumable(out, inputs: dict) -> str:
    """Why a run of ``out`` from ``inputs`` cannot be resumed (:func:`signatures` is None),
    in words: the journal is a local file beside a local output, and the inputs' signatures
    are their files' (an object store's objects have neither)."""
    why = "resume=True needs an output path and inputs stored as local files (.npy, .zarr)"
    if is_path(out) and urls.is_url(urls.local(os.fspath(out))):
        return (f"{why}: out {os.fspath(out)!r} is a URL; a run into an object store keeps no "
                f"journal (one that fails or is interrupted removes what it wrote), so there "
                f"is nothing to resume: run it again without resume")
    urls_in = [f"{role.lower()} {os.fspath(x)!r}" for role, x in inputs.items()
               if is_path(x) and urls.is_url(urls.local(os.fspath(x)))]
    if urls_in and is_path(out):
        return (f"{why}: {', '.join(urls_in)} {'is a URL' if len(urls_in) == 1 else 'are URLs'}"
                f", whose changes a journal cannot see; run it again without resume")
    return why


def nothing_to_resume(final: str) -> str:
    """Why ``resume=True`` of the output ``final``, which exists and has no interrupted run
    to finish, does nothing: a run publishes its output only once it is complete."""
    return (f"cannot resume: out {final!r} is complete (a run publishes its output only once "
            f"every block is written) and no interrupted run of it is left, so there is "
            f"nothing to resume; run without resume (--resume) to keep it, or with "
            f"overwrite=True (--overwrite) to compute it again")


def fingerprint(plan: Plan, inputs: dict, out, in_place: bool, layout: dict) -> dict:
    """What a run computes and from what: its ``inputs``' signatures (:func:`signatures`),
    the problem, the output and its ``layout``."""
    prob = plan.problem
    return {"inputs": inputs,
            "problem": {"m": prob.m, "n": prob.n, "k": prob.k, "dtype": prob.dtype,
                        "alpha": repr(prob.alpha), "beta": repr(prob.beta),
                        "trans_a": prob.trans_a, "trans_b": prob.trans_b},
            "out": {"path": os.path.abspath(os.fspath(out)), "in_place": in_place,
                    "layout": layout_text(layout)}}


def layout_text(layout: dict) -> str:
    """An output's ``layout`` as text that every process writes alike: codecs by their
    configuration (zarr's ``to_dict``, numcodecs' ``get_config``), where their repr may show
    a set, whose order is the process's (a blosc codec's: an identical resume was refused
    about half the time)."""
    return json.dumps(_plain(layout), sort_keys=True)


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(v) for v in value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    for method in ("to_dict", "get_config"):
        config = getattr(value, method, None)
        if callable(config):
            try:
                return _plain(config())
            except Exception:  # noqa: BLE001 - a codec that cannot say: its repr
                break
    return repr(value)


def schedule_key(plan: Plan) -> dict:
    """What fixes the order of every block's sums: the same key, the same bits
    (``split_blocks`` said where it is not every block's, so that the journals of plans
    that split every block, as all did before, still match)."""
    s = plan.staging
    key = {"device": backend_of(plan.device).kind, "kernel": plan.kernel,
           "tile": list(plan.tile), "staged": plan.staged, "ramp": s.ramp,
           "ramp_granule": s.ramp_granule, "split_last": s.split_last,
           "tail_panels": s.tail_panels, "n_a": s.n_a, "n_b": s.n_b,
           "symmetric": plan.symmetric}
    if s.split_blocks != "every":
        key["split_blocks"] = s.split_blocks
    return key


def header(plan: Plan, fingerprint_: dict) -> dict:
    """A new journal's header."""
    return {"fingerprint": fingerprint_, "schedule": schedule_key(plan)}


def resumable(plan: Plan, out, found: Callable[[Plan], dict]):
    """The interrupted run of this product into ``out`` to continue: (the plan that finishes
    it, its locked journal, its temporary output), or (``plan``, None, None) when there is
    none. ``found(plan)`` is this run's fingerprint for a plan.

    Raises
    ------
    OutputError
        The interrupted run computed something else (what changed, in words), or another
        process is writing it.
    """
    changed, busy = [], []
    for temporary in journals.candidates(os.fspath(out)):
        try:
            journal = journals.Journal(temporary)
        except BlockingIOError:
            busy.append(temporary)
            continue
        resumed = _judge(plan, journal, found)
        if isinstance(resumed, Plan):
            return resumed, journal, temporary
        journal.close()
        changed.append((temporary, resumed))
    if changed:
        temporary, differs = changed[0]
        raise OutputError(f"cannot resume: the interrupted run in {temporary!r} computed "
                          f"something else ({'; '.join(differs)}); run without resume to "
                          f"start again, and remove it")
    if busy:
        raise OutputError(f"cannot resume: another process is writing {busy[0]!r}")
    return plan, None, None


def _judge(plan: Plan, journal: journals.Journal, found: Callable[[Plan], dict]):
    """The plan that finishes the run ``journal`` holds, with its verified blocks done; or
    what differs from this run, in words."""
    head = journal.header
    tile = tuple(head.get("schedule", {}).get("tile", plan.tile))
    if plan.chosen_by == "tile" and tile != tuple(plan.tile):
        return [f"tile was {tile}, now {tuple(plan.tile)}"]  # another sum order
    try:  # the interrupted run's tile, which must fit this run's budgets
        forced = replan(plan, tile=tile, chosen_by="resume",
                        why="the interrupted run's tile, which it resumes")
    except BudgetError:
        journal.close()
        raise
    differs = (differences(head.get("fingerprint", {}), found(forced))
               or differences(head.get("schedule", {}), schedule_key(forced)))
    if differs:
        return differs
    done = journals.verified(journal)
    journal.blocks = {block: journal.blocks[block] for block in done}
    if forced.symmetric:  # a block above the diagonal is done once it is written across too
        done = {(i, j) for i, j in done if i <= j and (j, i) in done}
    return replan(forced, done=tuple(sorted(done)),
                  why=f"{len(done)} C blocks done before, kept")


def differences(was: dict, now: dict, where: str = "") -> list[str]:
    """What changed between two fingerprints, in words."""
    out = []
    for key in sorted(set(was) | set(now)):
        old, new = was.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += differences(old, new, f"{where}{key} ")
        elif old != new:
            what = f"{where}{key}".strip()
            if where.startswith("inputs"):
                out.append(f"input {key} changed (or moved) since")
            else:
                out.append(f"{what} was {old}, now {new}")
    return out


def warn_kept(final: str) -> None:
    """Before a fresh run of ``final``: say that an interrupted run of it can be finished
    instead, or that another run of it is under way."""
    kept = journals.candidates(final)
    if kept and journals.writer_alive(kept[0]):
        warnings.warn(f"oocgemm: another run of {final} is under way (it writes {kept[0]}); "
                      f"of the two, the one that commits last decides what the output holds",
                      RuntimeWarning, stacklevel=4)
    elif kept:
        warnings.warn(f"oocgemm: {kept[0]} holds the blocks of an interrupted run of {final}: "
                      f"resume=True (--resume) finishes it instead of starting again; remove "
                      f"it when it is not wanted", RuntimeWarning, stacklevel=4)


def name_left_behind(final: str) -> None:
    """After a commit of ``final``: warn of the temporary outputs earlier runs of it left;
    oocgemm does not remove what this run did not write."""
    left = journals.left_behind(final)
    if left:
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        warnings.warn(f"oocgemm: {final} is complete; {left[0]}{more}, left by an earlier "
                      f"run of it, is not needed any more: remove it", RuntimeWarning,
                      stacklevel=4)
