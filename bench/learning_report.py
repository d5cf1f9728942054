"""bench/learning.py's report of one day as it ends: per family the before %, after % and
delta, then what the night did (its stages, rows and steps, the budget, the stopping checks,
the mixed practice groups' margin, the gate and open chat) and how long the day took."""

from __future__ import annotations

import time


def tool_calls(result: dict) -> str:
    """Per family, how many held-out answers called a tool, before and after: a night that
    teaches calls where none belong shows here ("?": a day kept before the bench counted)."""
    def called(rounds: list[int] | None) -> str:
        return "?" if rounds is None else f"{sum(r > 0 for r in rounds)}/{len(rounds)}"
    before, after = result.get("calls_before") or {}, result["calls_after"]
    return ("held-out answers that called a tool, before -> after: "
            + ", ".join(f"{f} {called(before.get(f))} -> {called(after[f])}" for f in after))


def report(result: dict, started: float) -> None:
    print(f"\n{'family':<12}{'before %':>10}{'after %':>10}{'delta pp':>10}")
    deltas = []
    for family, before in result["before"].items():
        b = 100 * sum(r == 1.0 for r in before) / len(before)
        after = result["after"].get(family)
        if after is None:
            print(f"{family:<12}{b:>10.1f}{'n/a':>10}{'n/a':>10}")
            continue
        a = 100 * sum(r == 1.0 for r in after) / len(after)
        deltas.append(a - b)
        print(f"{family:<12}{b:>10.1f}{a:>10.1f}{a - b:>+10.1f}")
    mean = f"{sum(deltas) / len(deltas):+.1f} pp" if deltas else "n/a (no candidate)"
    print(f"mean delta: {mean}")
    if result.get("calls_after"):
        print(tool_calls(result))
    night_ = result.get("night", {})
    job = night_.get("job") or {}
    progress = job.get("progress", {})
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in night_.get("stages", {}).items())
    print(f"night #{job.get('id')}: {job.get('state')}, wall {night_.get('wall_s', 0):.0f} s "
          f"({stages})")
    if progress.get("gate_before_s") is not None:
        given = (progress.get("trained") or {}).get("budget_s")
        print(f"  the gate's live side: {progress['gate_before_s']:.0f} s of its gating, "
              "answered before training" + (f"; training was given {given:.0f} s"
                                            if given is not None else ""))
    timings = progress.get("timings") or {}
    if timings:
        print("  part 1 stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    counts, trained = progress.get("counts") or {}, progress.get("trained") or {}
    excluded = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("excluded:")}
    print(f"episodes: {counts.get('episodes', 'n/a')} kept, excluded {excluded or 'none'}")
    print(f"rows: {counts.get('rows', 'n/a')} in the dataset; trained: "
          f"{trained.get('sequences', 'n/a')} sequences, {trained.get('steps', 'n/a')} steps, "
          f"{trained.get('tokens', 'n/a')} tokens in {trained.get('seconds', 'n/a')} s")
    if trained.get("budget_note"):
        print(f"budget: {trained['budget_note']}")
    if trained.get("stop_checks"):
        checks = ", ".join(f"{c['step']}: {c['margin']:+.3f}" for c in trained["stop_checks"])
        print(f"stopping checks (step: held-out margin): {checks}"
              + (f"; {trained['stop_note']}" if trained.get("stop_note") else ""))
    groups = progress.get("groups_summary")
    if groups and groups.get("groups"):
        print(f"mixed practice groups: {groups['groups']}, advantage spread "
              f"{groups['adv_spread']:.2f}; passing against failing attempts after training "
              f"{groups['margin']:+.3f} nats a token ({groups['gained']} of {groups['groups']} "
              "gained)" if groups.get("margin") is not None else
              f"mixed practice groups: {groups['groups']} (no margin measured)")
    gate = progress.get("gate")
    if gate:
        outcome = gate.get("outcome") or ("promote" if gate["passed"] else "reject")
        gain = "no paired items" if gate.get("gain") is None else f"gain {gate['gain']:+.3f}"
        print(f"gate: {outcome} ({gain}); "
              + "; ".join(gate.get("reasons") or []))
        if gate.get("open_before") is not None and gate.get("open_after") is not None:
            print("open chat (the gate's prompts, judged in [-1, 1]): "
                  f"{gate['open_before']:+.2f} before, {gate['open_after']:+.2f} after")
    elif job.get("error"):
        print(f"night error: {job['error'].splitlines()[0][:300]}")
    kept = f" (the day kept in {result['day_from']})" if result.get("day_from") else ""
    print(f"before {result.get('before_s', 0):.0f} s, practice {result.get('practice_s', 0):.0f}"
          f" s{kept}; {'this run' if kept else 'whole benchmark'} "
          f"{time.monotonic() - started:.0f} s")
