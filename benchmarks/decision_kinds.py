"""Count a simulation's scheduling decisions by kind, to size a fast-path change first.

Runs one ``sloserve simulate`` command in this process with ``Instance._apply`` wrapped
(the simulation itself is unchanged: the wrapper only reads each batch before and after
the engine applies it) and prints, per kind, how many decisions there were:

* ``fast, decodes`` / ``fast, chunk``: fast-forwarded runs (all decodes; decodes plus a
  non-final chunk of a running prompt, of which those that go on through the prompt's
  final chunk, ``engine/chunk_run.py``, are counted apart too, as are joining chunks
  chained through their prompt's final chunk);
* ``single, ...``: single steps, split by what their batch holds: a prompt's first chunk
  (``join chunk``: the prompt joined this iteration, so the batch is not repeatable), a
  repeatable middle chunk the fast path ran for one iteration only (``left`` is how many
  non-final chunks the prompt had still to take, ``event``: a decode finishing or an
  arrival cut it), a prompt's final chunk, whole prompts, decodes only;
* ``(of all) policy not asked``: decisions (of any kind above) whose batch was the
  previous run of decodes again, taken without a policy call (``engine/decode_run.py``).

``chunk run`` counts the single steps whose batch is *exactly* the previous decision's
decodes plus the next chunk (final or not) of the same prompt, on the same replica: the
decisions a fast run spanning a chunked prefill from its first to its final chunk could
absorb at most (an upper bound: such a run would also have to stop at events).

    python benchmarks/decision_kinds.py -- simulate --profile llama-2-70b-a100x2 \\
        --max-running 128 --max-batch-tokens 4096 --trace T.csv --policy sarathi \\
        --replicas 4 --router least-outstanding --json
"""

from __future__ import annotations

import collections
import contextlib
import io
import sys
from typing import Any

from sloserve.engine import decode_run
from sloserve.engine import instance as instance_mod
from sloserve.engine.interface import SchedulerOutput


def _split(out: SchedulerOutput) -> tuple[list[int], list[tuple[int, int, int, int]]]:
    """The batch's one-token decodes (ids) and its prefill entries
    ``(id, tokens, remaining, computed)``, read before the engine applies the batch."""
    decodes: list[int] = []
    chunks: list[tuple[int, int, int, int]] = []
    for r, n in out.batch:
        remaining = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
        if r.num_output_tokens and n == 1 and remaining == 1:
            decodes.append(r.req_id)
        else:
            chunks.append((r.req_id, n, remaining, r.num_computed_tokens))
    return decodes, chunks


def main(argv: list[str]) -> int:
    counts: collections.Counter[str] = collections.Counter()
    prev: dict[int, tuple[list[int], list[tuple[int, int, int, int]]]] = {}
    real = instance_mod.Instance._apply

    def apply(self: Any, out: SchedulerOutput, now: float) -> Any:
        decodes, chunks = _split(out)
        pending = real(self, out, now)
        last = prev.get(self.instance_id)
        prev[self.instance_id] = (decodes, chunks)
        if pending.fast:
            counts["fast, chunk" if chunks else "fast, decodes"] += 1
            if pending.final is not None:  # it goes on through the prompt's final chunk
                counts["fast, chunk (of which through the final chunk)"] += 1
            return pending
        counts["single (all)"] += 1
        if pending.final is not None:  # a joining chunk chained to the prompt's final one
            counts["single, join chunk (of which chained through the final chunk)"] += 1
        if (
            last is not None
            and len(chunks) == 1
            and len(last[1]) == 1
            and chunks[0][0] == last[1][0][0]
            and decodes == last[0]
        ):
            counts["single, chunk run (same decodes + next chunk of the same prompt)"] += 1
        if not chunks:
            counts["single, decodes only"] += 1
        elif any(n < rem and done == 0 for _i, n, rem, done in chunks):
            counts["single, join chunk (a prompt's first, non-final chunk)"] += 1
        elif any(n < rem for _i, n, rem, _d in chunks):
            left = min((rem - 1) // n for _i, n, rem, _d in chunks if n < rem)
            why = f"left={left}" if left <= 1 else "event"
            counts[f"single, middle chunk, repeatable={out.repeatable}, {why}"] += 1
        elif any(done > 0 for _i, _n, _rem, done in chunks):
            counts["single, final chunk"] += 1
        else:
            counts["single, whole prompts"] += 1
        return pending

    instance_mod.Instance._apply = apply  # type: ignore[method-assign]
    real_repeat = decode_run.repeat

    def repeat(inst: Any, cont: Any) -> Any:
        out = real_repeat(inst, cont)
        if out is not None:
            counts["(of all) policy not asked: its decode run promised again"] += 1
        return out

    decode_run.repeat = repeat
    from sloserve.cli import main as cli_main

    sys.argv = ["sloserve", *argv]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli_main()
        except SystemExit as e:
            if e.code:
                raise
    total = counts["fast, chunk"] + counts["fast, decodes"] + counts["single (all)"]
    print(f"{'decisions':<72} {total:>7}")
    for kind, n in sorted(counts.items(), key=lambda kv: (kv[0].split(",")[0], -kv[1])):
        print(f"{kind:<72} {n:>7}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    raise SystemExit(main(args))
