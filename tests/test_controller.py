"""The online speed controller on a fake clock: it converges, it follows costs that change mid-run, its
exploration is bounded, and a drafter that pays nothing costs little against plain. The engine chooser of
compiled static verification on the same clock: warm-up never counts, each bucket gets its faster engine, it
follows costs that change, and it re-checks the other engine rarely."""

from __future__ import annotations

import random

import pytest

from hf_spec.controller import EngineChooser, SpeedController, controller_for


def run(controller: SpeedController, cycle, cycles: int, rng: random.Random, start_cycle: int = 0) -> list[int]:
    """Drive ``controller`` for ``cycles`` cycles; ``cycle(arm, n, rng) -> (seconds, tokens)``; the arms used."""
    used = []
    for n in range(start_cycle, start_cycle + cycles):
        arm = controller.choose()
        seconds, tokens = cycle(arm, n, rng)
        controller.record(arm, seconds, tokens)
        used.append(arm)
    return used


def landscape(costs, taus, noise: float = 0.1):
    """Arm i: a cycle costs ``costs[i]`` seconds (± noise) and commits about ``taus[i]`` tokens (a random integer
    around it, as accepted lengths vary)."""

    def cycle(arm, n, rng):
        tau = taus[arm]
        tokens = int(tau) + (rng.random() < tau - int(tau))
        return costs[arm] * (1 + noise * (2 * rng.random() - 1)), tokens

    return cycle


def seconds_per_token(costs, taus):
    return [c / t for c, t in zip(costs, taus)]


def mean_seconds_per_token(used, costs, taus) -> float:
    """Expected seconds per committed token of the cycles ``used`` ran."""
    return sum(costs[a] for a in used) / sum(taus[a] for a in used)


def test_converges_to_the_fastest_rung_of_the_ladder():
    costs, taus = [1.0, 1.3, 1.5, 1.9, 2.6], [1, 2.0, 2.6, 3.0, 3.2]  # per token: 1.0, .65, .58, .63, .81
    share = []
    for seed in range(4):
        controller = SpeedController(["plain", "a", "b", "c", "d"], start=1)
        rng = random.Random(seed)
        run(controller, landscape(costs, taus), 200, rng)
        assert controller.current == 2
        used = run(controller, landscape(costs, taus), 200, rng, start_cycle=200)
        share.append(used.count(2) / len(used))
        assert mean_seconds_per_token(used, costs, taus) <= 1.06 * min(seconds_per_token(costs, taus))
    assert sum(share) / len(share) >= 0.75  # exploits the best rung, probes the rest a little


def test_a_clear_win_hurries_on_up_the_ladder():
    """From plain, each rung clearly faster than the last: every move that gains much probes the next rung at once,
    so the best rung is reached in a few tens of cycles (one rung per ``first_interval`` took about 70)."""
    costs, taus = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], [1, 1.6, 2.2, 2.8, 3.4, 4.0]  # per token 1.0 .. 0.375
    reached = []
    for seed in range(6):
        controller = SpeedController(["plain", "a", "b", "c", "d", "e"], start=0)
        used = run(controller, landscape(costs, taus), 120, random.Random(seed))
        reached.append(used.index(5))
    assert sum(reached) / len(reached) <= 50, reached


def test_a_drafter_that_pays_nothing_falls_back_to_plain_and_costs_little():
    costs, taus = [1.0, 1.35, 1.6], [1, 1.02, 1.03]  # an untrained drafter: drafting only adds cost
    controller = SpeedController(["plain", "small", "large"], start=1)
    rng = random.Random(1)
    cycle = landscape(costs, taus, noise=0.2)
    used = run(controller, cycle, 60, rng)
    assert controller.current == 0 and used[-20:].count(0) >= 12  # within tens of cycles
    later = run(controller, cycle, 3000, rng, start_cycle=60)
    spent = sum(costs[a] for a in later)
    assert spent <= 1.03 * len(later) * costs[0]  # bounded worst case: within 3% of plain once converged
    assert controller.probes >= 5  # it keeps checking


def test_follows_costs_that_change_mid_run():
    rng = random.Random(2)
    taus = [1, 2.2, 2.9]
    fast, slow = [1.0, 1.2, 1.5], [1.0, 2.6, 3.6]  # drafting pays; then verification became costly: plain wins
    controller = SpeedController(["plain", "small", "large"], start=1)
    used = run(controller, landscape(fast, taus), 300, rng)
    assert mean_seconds_per_token(used[100:], fast, taus) <= 1.06 * min(seconds_per_token(fast, taus))
    used = run(controller, landscape(slow, taus), 300, rng, start_cycle=300)
    late = used[100:]  # within a hundred cycles of the change it is back to plain, probing a little
    assert late.count(0) >= 0.8 * len(late)
    assert mean_seconds_per_token(late, slow, taus) <= 1.06 * min(seconds_per_token(slow, taus))
    used = run(controller, landscape(fast, taus), 400, rng, start_cycle=600)
    late = used[100:]  # and drafting again once it pays again
    assert mean_seconds_per_token(late, fast, taus) <= 1.06 * min(seconds_per_token(fast, taus))


def test_exploration_is_bounded_once_converged():
    costs, taus = [1.0, 1.2, 1.5, 2.0], [1, 2.4, 2.6, 2.7]
    controller = SpeedController(["plain", "a", "b", "c"], start=3)
    rng = random.Random(3)
    run(controller, landscape(costs, taus), 200, rng)
    assert controller.current == 1
    used = run(controller, landscape(costs, taus), 2000, rng, start_cycle=200)
    best = min(seconds_per_token(costs, taus))
    assert mean_seconds_per_token(used, costs, taus) <= 1.03 * best  # probes cost under 3% in time per token
    assert used.count(1) >= 0.9 * len(used)


def test_switch_cycles_are_not_measured():
    """The first cycle after a change of arm carries catch-up work (the drafter reads what it missed): a huge
    time there must not count against the arm."""
    controller = SpeedController(["plain", "draft"], start=1, first_interval=4)
    previous = None
    for _ in range(200):
        arm = controller.choose()
        slow_switch = previous is not None and arm != previous
        seconds = 50.0 if slow_switch else (1.2 if arm == 1 else 1.0)
        controller.record(arm, seconds, 2 if arm == 1 else 1)
        previous = arm
    assert controller.current == 1
    assert controller.ms_per_token()["draft"] == pytest.approx(600.0, rel=0.01)


def test_the_first_cycle_of_a_call_is_not_measured():
    controller = SpeedController(["plain", "draft"], start=1)
    controller.start_call()
    controller.record(controller.choose(), 100.0, 1)  # the drafter read the prompt
    controller.record(controller.choose(), 1.0, 2)
    assert controller.ms_per_token()["draft"] == pytest.approx(500.0)


def test_one_arm_never_probes_and_bad_starts_are_rejected():
    controller = SpeedController(["fixed"], start=0)
    assert run(controller, landscape([1.0], [2]), 50, random.Random(0)) == [0] * 50 and controller.probes == 0
    with pytest.raises(ValueError, match="start"):
        SpeedController(["plain", "a"], start=2)
    with pytest.raises(ValueError, match="at least one arm"):
        SpeedController([])


def test_one_controller_per_owner_and_key_for_the_process():
    class Owner:
        pass

    owner = Owner()
    first = controller_for(owner, ("t", "cpu"), ["plain", "a"], 1)
    assert controller_for(owner, ("t", "cpu"), ["plain", "a"], 1) is first
    assert controller_for(owner, ("t", "cuda"), ["plain", "a"], 1) is not first
    assert controller_for(owner, ("t", "cpu"), ["plain", "b"], 1) is not first  # other arms: a new controller


def test_one_stall_does_not_condemn_an_arm():
    """A 5-second stall in one cycle (another process, a pause) counts as at most three ordinary cycles."""
    controller = SpeedController(["plain", "draft"], start=1)
    rng = random.Random(4)
    cycle = landscape([0.02, 0.025], [1, 2.5])
    run(controller, cycle, 40, rng)
    controller.record(controller.choose(), 5.0, 2)  # the stall
    assert controller.current == 1 and controller.ms_per_token()["draft"] < 15.0
    used = run(controller, cycle, 100, rng, start_cycle=41)
    assert used.count(1) >= 0.85 * len(used)


def test_a_drafter_that_barely_loses_to_plain_is_probed_rarely():
    """Drafted cycles 15% slower than plain steps per token: after tens of cycles on plain steps, its probes back
    off as those of a hopeless drafter do (under 1% of the time)."""
    costs, taus = [1.0, 1.15], [1, 1.0]
    controller = SpeedController(["plain", "draft"], start=1)
    rng = random.Random(6)
    run(controller, landscape(costs, taus, noise=0.1), 200, rng)
    assert controller.current == 0
    used = run(controller, landscape(costs, taus, noise=0.1), 3000, rng, start_cycle=200)
    assert mean_seconds_per_token(used, costs, taus) <= 1.01 * costs[0]


def test_a_neighbour_that_narrowly_failed_is_not_probed_without_end():
    """Plain steps 1% slower per token than the exploited drafted arm: each probe of plain fails narrowly, and the
    drafted arm keeps running between probes (plain is not re-probed cycle after cycle)."""
    costs, taus = [1.0, 1.98], [1, 2]  # per token: plain 1.0, drafted 0.99
    controller = SpeedController(["plain", "draft"], start=1)
    used = run(controller, landscape(costs, taus, noise=0.0), 1000, random.Random(7))
    assert controller.current == 1 and used[200:].count(1) >= 0.5 * len(used[200:])
    assert mean_seconds_per_token(used[200:], costs, taus) <= 1.01 * 0.99


def test_probes_of_a_close_neighbour_come_often_and_cost_little():
    """The wait after a failed probe is what it cost over the exploration budget: a drafted arm 3% slower than
    plain is probed every few tens of cycles (the text may move to where it wins), at about 1% of the time."""
    costs, taus = [1.0, 1.03], [1, 1.0]
    controller = SpeedController(["plain", "draft"], start=0)
    rng = random.Random(8)
    run(controller, landscape(costs, taus, noise=0.0), 100, rng)
    probes = controller.probes
    used = run(controller, landscape(costs, taus, noise=0.0), 2000, rng, start_cycle=100)
    assert controller.probes - probes >= 2000 / 64  # often: far more than doubling waits up to 512 cycles give
    assert sum(costs[a] for a in used) <= 1.015 * len(used)  # and cheap


def test_a_new_call_on_plain_probes_drafting_early():
    """A prose answer where drafting does not pay puts the controller on plain; the next call's text (code, say) makes
    drafting pay: plain's own timing cannot show that, so the new call probes the drafted arm within a few cycles."""
    rng = random.Random(5)
    costs = [1.0, 1.3]
    controller = SpeedController(["plain", "draft"], start=1)
    controller.start_call()
    run(controller, landscape(costs, [1, 1.16]), 120, rng)  # prose: drafting 12% slower per token than plain
    assert controller.current == 0
    controller.start_call()
    used = run(controller, landscape(costs, [1, 2.6]), 40, rng, start_cycle=120)  # code: drafting pays 2x
    assert controller.current == 1 and used.index(1) <= 3
    assert used[-30:].count(1) >= 24  # exploits drafting, probing plain now and then


def test_a_new_call_on_plain_probes_drafting_early_when_any_drafted_arm_was_accepted():
    """Plain's neighbour is the cheapest rung (one drafted token): on a prose answer it may run a few cycles that
    accept nothing while a bigger tree's drafts were accepted. The drafter's drafts are accepted at all, so the next
    call (code) still probes drafting within a few cycles."""
    controller = SpeedController(["plain", "small", "large"], start=2)
    controller.start_call()
    used = run(controller, landscape([1.0, 1.2, 1.4], [1, 1.0, 1.25], noise=0.0), 120, random.Random(11))  # prose
    assert controller.current == 0 and 1 in used  # plain, and the small rung was probed (it accepted nothing)
    controller.start_call()
    used = run(controller, landscape([1.0, 1.2, 1.4], [1, 2.0, 2.6], noise=0.0), 30, random.Random(12), 120)  # code
    assert used.index(1) <= 3 and controller.current != 0


def test_a_cold_first_answer_that_accepts_nothing_does_not_keep_the_next_on_plain():
    """A cold process's first answer is prose where the few drafted cycles accept nothing: it moves to plain. Those
    few cycles must not say the drafter's drafts are never accepted: the next call (code, where drafting pays 2x)
    still probes drafting within a few cycles."""
    costs = [1.0, 1.2, 1.4]
    for seed in range(4):
        controller, rng = SpeedController(["plain", "small", "large"], start=2), random.Random(seed)
        controller.start_call()
        run(controller, landscape(costs, [1, 1.0, 1.0], noise=0.1), 60, rng)  # prose: drafts never accepted
        assert controller.current == 0
        controller.start_call()
        used = run(controller, landscape(costs, [1, 2.0, 2.6], noise=0.1), 40, rng, 60)  # code
        assert used.index(1) <= 3 and controller.current != 0, used


def test_new_calls_on_plain_with_a_drafter_that_pays_nothing_cost_little():
    """A drafter whose drafts are never accepted is not re-probed in every call: over 128-token calls it costs ~1.5% at
    most."""
    rng = random.Random(6)
    costs, taus = [1.0, 1.35], [1, 1.0]
    controller = SpeedController(["plain", "draft"], start=1)
    spent = tokens = 0.0
    for call in range(40):
        controller.start_call()
        for _ in range(128):
            arm = controller.choose()
            seconds, committed = landscape(costs, taus, noise=0.2)(arm, 0, rng)
            controller.record(arm, seconds, committed)
            if call >= 2:
                spent, tokens = spent + costs[arm], tokens + committed
    assert spent <= 1.015 * tokens * costs[0]


def test_a_drafter_whose_drafts_are_not_accepted_never_replaces_plain_whatever_the_times_read():
    """A drafted cycle costs at least a plain step, so a drafted arm that commits one token per row per cycle cannot
    be faster: when timing noise reads it 5% faster per token, the token counts still choose plain, from a drafted
    start and from plain."""
    costs, taus = [1.0, 0.95], [1, 1.0]  # impossible timings: only noise reads a drafted cycle below a plain step
    for start in (1, 0):
        controller, rng, exploited = SpeedController(["plain", "draft"], start=start), random.Random(9), []
        for n in range(400):
            run(controller, landscape(costs, taus, noise=0.0), 1, rng, start_cycle=n)
            exploited.append(controller.current)
        assert controller.probes >= 10 and controller.moves == start  # it probes, and leaves the drafted start only
        assert exploited[20:] == [0] * 380
    batched = SpeedController(["plain", "draft"], start=1)  # rows: four rows committing one token each per cycle
    for _ in range(200):
        arm = batched.choose()
        batched.record(arm, costs[arm], 4, rows=4)
    assert batched.current == 0


def slow_spells(costs, taus, slow: float = 1.6, spell: int = 30):
    """Like :func:`landscape`, on a machine that runs ``slow`` times slower in spells of 1 to ``2 * spell`` cycles
    (half the time), as a shared 2-core machine does: a probe and the cycles it is weighed against can fall on
    different sides of a spell."""
    state = {"factor": 1.0, "left": 0}
    base = landscape(costs, taus)

    def cycle(arm, n, rng):
        if state["left"] <= 0:
            state["factor"], state["left"] = (slow if rng.random() < 0.5 else 1.0), rng.randint(1, 2 * spell)
        state["left"] -= 1
        seconds, tokens = base(arm, n, rng)
        return seconds * state["factor"], tokens

    return cycle


def test_a_drafter_that_pays_nothing_costs_little_on_a_machine_with_slow_spells():
    """The worst case on a noisy machine: over 128-token calls after the first, a drafter whose drafts are never
    accepted (cycles 10% dearer than plain steps) costs at most 2.5% in every run (time-only moves: up to 3%)."""
    costs, taus = [1.0, 1.1], [1, 1.0]
    for seed in range(20):
        rng = random.Random(seed)
        controller, cycle, used = SpeedController(["plain", "draft"], start=1), slow_spells(costs, taus), []
        for call in range(10):
            controller.start_call()
            used += run(controller, cycle, 128, rng)
        later = used[128:]
        assert sum(costs[a] for a in later) <= 1.025 * len(later), seed


def test_a_ladder_of_two_dimensions_is_climbed_one_dimension_at_a_time():
    """Tree shapes crossed with n-gram budgets (the ladder a drafter's candidates make): the rung after the small tree
    with the small budget is the small tree with the big budget, slower than both its ladder neighbours, while the big
    tree with the small budget is the fastest. On the ladder alone the climb stops below the dip; with positions the
    big tree with the small budget is a neighbour (one step in one coordinate) and the climb reaches it."""
    labels = ["plain", "small tree, 3 ngram", "small tree, 8 ngram", "big tree, 3 ngram", "big tree, 8 ngram"]
    positions = [None, (0, 0), (0, 1), (1, 0), (1, 1)]
    costs, taus = [1.0, 1.4, 1.9, 1.5, 2.7], [1, 2.0, 2.0, 3.0, 3.0]  # per token: 1.0, .70, .95, .50, .90
    best = min(seconds_per_token(costs, taus))
    for seed in range(4):
        stuck = SpeedController(labels, start=1)
        run(stuck, landscape(costs, taus), 300, random.Random(seed))
        assert stuck.current == 1  # why positions exist: the dip at rung 2 hides rung 3
        controller = SpeedController(labels, start=1, positions=positions)
        rng = random.Random(seed)
        run(controller, landscape(costs, taus), 100, rng)
        assert controller.current == 3
        used = run(controller, landscape(costs, taus), 300, rng, start_cycle=100)
        assert mean_seconds_per_token(used, costs, taus) <= 1.06 * best


def chain_landscape(arms):
    """Arm i = (cycle cost, acceptance per draft, tree depth): a cycle commits 1 + the drafts accepted in a row (a
    draft is accepted with that probability, up to the depth), so tokens per cycle range over 1..depth + 1 as in
    real decoding, not around a mean."""

    def cycle(arm, n, rng):
        cost, accept, depth = arms[arm]
        tokens = 1
        while tokens <= depth and rng.random() < accept:
            tokens += 1
        return cost * (1 + 0.1 * (2 * rng.random() - 1)), tokens

    return cycle


def test_drafted_arms_of_equal_speed_are_not_walked_between():
    """Three tree depths with the same expected time per token: a probe of a few cycles reads one of them as faster
    by chance about half the time, and the margin alone walked between them; the significance test of the probes'
    cycles holds still most of the time, and still climbs to a clearly faster arm."""
    taus = [1.0, 1.96, 2.3056, 2.43]  # 1 + .6 + .6^2 + ... up to depth 2, 4, 6
    equal = [(1.0, 0.0, 0), (1.2, 0.6, 2), (1.2 * taus[2] / taus[1], 0.6, 4), (1.2 * taus[3] / taus[1], 0.6, 6)]
    moves = {}
    for significance in (0.0, SpeedController.significance):
        moves[significance] = 0
        for seed in range(6):
            controller = SpeedController(["plain", "a", "b", "c"], start=2, significance=significance)
            rng, cycle = random.Random(seed), chain_landscape(equal)
            for n in range(3000):
                if n % 64 == 0:
                    controller.start_call()
                arm = controller.choose()
                controller.record(arm, *cycle(arm, n, rng))
            moves[significance] += controller.moves
    assert moves[SpeedController.significance] <= 0.6 * moves[0.0], moves
    faster = [equal[0], equal[1], (0.8 * equal[2][0], 0.6, 4), equal[3]]  # b 20% faster per token than a and c
    for seed in range(4):
        controller = SpeedController(["plain", "a", "b", "c"], start=1)
        used = run(controller, chain_landscape(faster), 400, random.Random(seed))
        assert controller.current == 2 and used[200:].count(2) >= 0.75 * 200


def test_copy_cycles_do_not_move_the_controller_between_drafted_arms():
    """A probe that lands on a copy passage commits 15 tokens a cycle whatever the arm: weighed like other cycles, it
    moved the controller to a costlier tree that is slower on every other cycle; flagged as copies, it does not."""
    for flagged in (True, False):
        controller = SpeedController(["plain", "small", "big"], start=1)
        while True:
            arm = controller.choose()
            if arm == 2:
                break
            controller.record(arm, 1.2, 2)
        while controller.choose() == 2:  # the probe of the big tree runs on the copy passage
            controller.record(2, 1.9, 15, copied=flagged)
        assert controller.current == (1 if flagged else 2)


def test_copy_cycles_count_for_drafting_against_plain():
    """Between plain and drafting a copy cycle counts: a drafter that copies is kept, though its other cycles pay
    nothing."""
    controller = SpeedController(["plain", "drafted"], start=1)
    for n in range(400):
        arm = controller.choose()
        copied = arm == 1 and n % 4 == 0
        controller.record(arm, 1.0 if arm == 0 else 1.1, 15 if copied else 1, copied=copied)
    assert controller.current == 1


def test_a_faster_arm_beyond_slower_neighbours_is_found_again():
    """Exploiting c (moved there by a lucky spell, say) whose neighbours b and plain are slower, while a, two rungs
    away, measured faster: the controller probes a and returns to it; with neighbours only it stays on c."""
    arms = [(1.0, 0.0, 0), (1.2, 0.6, 2), (3.0, 0.6, 3), (1.49, 0.6, 3)]  # per token: 1.0, .61, 1.38, .69
    for far in (True, False):
        returned = 0
        for seed in range(4):
            controller = SpeedController(["plain", "a", "b", "c"], start=1)
            if not far:
                controller._far = lambda: None
            rng, cycle = random.Random(seed), chain_landscape(arms)
            run(controller, cycle, 100, rng)
            assert controller.current == 1
            controller.current = 3  # where a lucky spell left it, having run it 20 cycles
            for _ in range(20):
                controller.record(3, *cycle(3, 0, rng))
            used = run(controller, cycle, 600, rng, start_cycle=120)
            returned += controller.current == 1 and used[-200:].count(1) >= 150
        assert returned == (4 if far else 0), (far, returned)


def test_a_costlier_rung_that_failed_on_hard_text_is_probed_again_when_the_text_gets_easier():
    """Prose (drafts rarely accepted) puts the controller on the small tree and the big tree's probe fails there,
    budgeting a long wait; then the answer moves to code, where the big tree is much faster. The exploited arm's
    falling time per token brings the big tree's probe forward: it moves within tens of cycles, not after the wait."""
    costs = [1.0, 1.3, 2.0]
    hard, easy = [1, 1.6, 1.3], [1, 2.2, 4.4]  # per token: prose 1.0, .81, 1.54; code 1.0, .59, .45
    for easier, bound in ((SpeedController.easier, 70), (None, None)):
        after = []
        for seed in range(6):
            controller = SpeedController(["plain", "small", "big"], start=1, easier=easier)
            rng = random.Random(seed)
            run(controller, landscape(costs, hard), 400, rng)
            assert controller.current == 1
            used = run(controller, landscape(costs, easy), 300, rng, start_cycle=400)
            assert controller.current == 2
            after.append(next(i for i in range(len(used)) if used[i:i + 20].count(2) >= 15))
        if bound is not None:
            assert max(after) <= bound, after
        else:  # the wait budgeted on the hard text alone: later on some seeds
            assert max(after) > 100, after


def test_neighbours_with_positions():
    """Plain and the ladder's rungs next to an arm, and per coordinate the nearest arm equal in the other one; plain's
    only neighbour is the cheapest rung. Positions are checked."""
    positions = [None, (0, 0), (0, 1), (1, 0), (1, 1), (1, 3), (2, 1), (3, 2)]  # a ParallelSpec ladder
    controller = SpeedController([str(i) for i in range(8)], start=1, positions=positions)
    expected = {0: [1], 1: [0, 2, 3], 2: [0, 1, 3, 4], 3: [0, 1, 2, 4], 4: [0, 2, 3, 5, 6], 5: [0, 4, 6], 6: [0, 4, 5, 7],
                7: [0, 6]}  # fmt: skip
    for arm, neighbours in expected.items():
        controller.current = arm
        assert controller._neighbours() == neighbours, arm
    with pytest.raises(ValueError, match="one entry per arm"):
        SpeedController(["plain", "a"], positions=[(0,), (0,)])
    with pytest.raises(ValueError, match="one length"):
        SpeedController(["plain", "a", "b"], positions=[None, (0,), (0, 1)])
    with pytest.raises(ValueError, match="one length"):
        SpeedController(["plain", "a", "b"], positions=[None, (0,), None])


# -- the engine chooser ----------------------------------------------------------------------------------------
def run_engines(chooser: EngineChooser, cost, sizes: list[int], calls: dict | None = None) -> list[tuple[str, bool]]:
    """One forward per entry of ``sizes`` (bucket sizes); ``cost(size, engine, k) -> seconds``, k counting that
    bucket's forwards on that engine (``calls``, kept across runs); records the time only when the chooser asks for
    it. Returns each forward's (engine, timed)."""
    calls = {} if calls is None else calls
    used = []
    for size in sizes:
        engine, timed = chooser.choose(size)
        k = calls[size, engine] = calls.get((size, engine), -1) + 1
        chooser.record(size, engine, cost(size, engine, k) if timed else None)
        used.append((engine, timed))
    return used


def noisy(table, rng: random.Random, noise: float = 0.1):
    """Seconds of a forward from ``table[size][engine]`` (± noise)."""
    return lambda size, engine, k: table[size][engine] * (1 + noise * (2 * rng.random() - 1))


def test_warm_up_forwards_are_never_timed_and_never_condemn_compiled():
    """A compiled engine whose first two forwards take 100x longer (compilation, CUDA-graph capture) and is faster
    afterwards: those forwards are not timed, and compiled is exploited from the first check on."""
    rng = random.Random(0)
    steady = noisy({8: {"eager": 1.5, "compiled": 1.0}}, rng)
    slow_starts = []

    def cost(size, engine, k):
        if engine == "compiled" and k < 2:
            slow_starts.append(k)
        return 100.0 * steady(size, engine, k) if engine == "compiled" and k < 2 else steady(size, engine, k)

    chooser = EngineChooser()
    used = run_engines(chooser, cost, [8] * 100)
    assert used[0] == ("compiled", False) and used[1] == ("eager", False)  # the prior first, then alternating
    assert slow_starts == []  # the chooser never asked to time them
    assert [engine for engine, _ in used].count("eager") <= 12  # the first check and one re-check
    summary = chooser.summary()[8]
    assert summary["engine"] == "compiled" and summary["ms_per_forward"]["compiled"] < 1200.0


def test_each_bucket_gets_its_own_faster_engine():
    """Compiled wins on small forwards, eager on large ones: the two buckets, interleaved, are chosen apart."""
    rng = random.Random(1)
    cost = noisy({4: {"eager": 2.0, "compiled": 1.0}, 32: {"eager": 2.0, "compiled": 3.0}}, rng)
    chooser = EngineChooser()
    sizes = [rng.choice([4, 32]) for _ in range(3000)]
    used = run_engines(chooser, cost, sizes)
    summary = chooser.summary()
    assert summary[4]["engine"] == "compiled" and summary[32]["engine"] == "eager"
    late = list(zip(sizes, used))[1000:]
    for size, best in ((4, "compiled"), (32, "eager")):
        mine = [engine for s, (engine, _) in late if s == size]
        assert mine.count(best) >= 0.97 * len(mine), (size, summary)


def test_follows_costs_that_change():
    """Compiled faster, then (another load on the machine) eager faster, then compiled again: each time the chooser
    moves within ``max_wait`` forwards and exploits the faster engine."""
    rng = random.Random(2)
    chooser = EngineChooser()
    calls: dict = {}
    for best, table in (("compiled", {"eager": 2.0, "compiled": 1.0}), ("eager", {"eager": 1.0, "compiled": 2.0}),
                        ("compiled", {"eager": 2.0, "compiled": 1.0})):  # fmt: skip
        used = run_engines(chooser, noisy({16: table}, rng), [16] * 1500, calls)
        late = [engine for engine, _ in used[chooser.max_wait + 2 * (chooser.warmup + chooser.samples) :]]
        assert chooser.summary()[16]["engine"] == best
        assert late.count(best) >= 0.97 * len(late), best


def test_exploration_of_the_losing_engine_is_bounded():
    """Eager 60% slower than compiled over 2,000 forwards: a handful of re-checks (their waits grow while eager keeps
    losing), eager runs under 2% of the forwards, and only forwards of a check are timed (no host sync otherwise)."""
    rng = random.Random(3)
    chooser = EngineChooser()
    used = run_engines(chooser, noisy({8: {"eager": 1.6, "compiled": 1.0}}, rng), [8] * 2000)
    summary = chooser.summary()[8]
    rechecks = summary["checks"] - 1
    assert 3 <= rechecks <= 8, summary  # it keeps checking, rarely
    assert summary["calls"]["eager"] <= 0.02 * len(used), summary
    assert sum(timed for _, timed in used) == 2 * chooser.samples * summary["checks"]


def test_engine_chooser_rejects_an_unknown_prior():
    with pytest.raises(ValueError, match="prior"):
        EngineChooser(prior="jit")
