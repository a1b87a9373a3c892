"""The decision step: observation, model, smoothing, slots, ICM inputs and state bytes.

Expected values are rebuilt here from the shared contract (``allocator.portfolio``) and the
test graphs' numpy references, never from the code under test.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.portfolio import CASH_ID, FeatureSpec, build_raw_observation, ema_smooth, renormalize
from allocator.serving import LoadedModel
from allocator.serving.decision import decide_many
from allocator.serving.portfolio_state import LastAnswer, ModelKey, PortfolioState, StateDecodeError
from tests.serving import Spec, policy_weights, reference_policy
from tests.serving.conftest import TINY, decide_one, reference_icm, request_for, write_tiny_model

SPEC = FeatureSpec(max_assets=TINY.max_assets, window=TINY.window)
BETA = 0.5  # make_manifest's


def prices_for(n: int, seed: int, window: int = TINY.window) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, (n, window + 1)), axis=1))


def slot_layout(values: np.ndarray, slots: list[int], n_slots: int = TINY.n_slots) -> np.ndarray:
    """Request-order values (cash first) placed into slot layout."""
    out = np.zeros(n_slots)
    out[[0, *slots]] = values
    return out


def expected_step(
    prices: np.ndarray, slots: list[int], current: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw observation, action, raw weights in slot layout) from the contract and the graph."""
    p = np.ones((SPEC.max_assets, SPEC.prices_per_asset))
    p[np.subtract(slots, 1)] = prices
    mask = np.zeros(SPEC.n_slots, bool)
    mask[[0, *slots]] = True
    obs = build_raw_observation(p, current, mask, SPEC)
    action, weights = reference_policy(
        policy_weights(TINY), obs[None], mask[None].astype(np.float32)
    )
    return obs, action[0], renormalize(weights[0], mask)


def test_first_decision_is_the_policy_on_the_raw_observation(tiny_model: LoadedModel) -> None:
    p = prices_for(3, seed=1)
    out, state = decide_one(tiny_model, request_for(tiny_model, ("X", "Y", "Z"), p), None)
    obs, action, raw = expected_step(p, [1, 2, 3], np.eye(SPEC.n_slots)[0])
    assert out.asset_ids == (CASH_ID, "X", "Y", "Z")
    np.testing.assert_allclose(out.raw_weights, raw[:4], atol=1e-6)
    np.testing.assert_array_equal(out.smoothed_weights, out.raw_weights)  # s_0 = w_0
    assert out.raw_weights.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(out.current_weights, [1.0, 0.0, 0.0, 0.0])  # new: all cash
    assert out.turnover == pytest.approx(out.smoothed_weights[1:].sum(), abs=1e-12)
    assert out.icm_reward is None  # no previous observation
    assert state.steps == 1
    assert state.model == ModelKey("tiny", "1", SPEC.n_slots)
    assert state.slots == ("X", "Y", "Z", "")
    np.testing.assert_allclose(state.observation, obs, atol=1e-7)
    np.testing.assert_allclose(state.action, action, atol=1e-6)
    assert state.smoothed[4] == 0.0


def test_sequence_smooths_with_the_manifest_beta_and_reads_the_icm_contract(
    tiny_model: LoadedModel,
) -> None:
    """EMA with beta, turnover against the sent weights, ICM(prev obs, prev ACTION, obs)."""
    ids = ("X", "Y", "Z")
    state = None
    previous_smoothed = None
    previous_obs = previous_action = None
    for k in range(4):
        p = prices_for(3, seed=10 + k)
        current = np.array([0.1, 0.2, 0.3, 0.4]) if k % 2 else None
        out, state = decide_one(tiny_model, request_for(tiny_model, ids, p, current), state)
        base = (
            slot_layout(current, [1, 2, 3])
            if current is not None
            else (previous_smoothed if previous_smoothed is not None else np.eye(5)[0])
        )
        obs, action, raw = expected_step(p, [1, 2, 3], base)
        np.testing.assert_allclose(out.raw_weights, raw[:4], atol=1e-6)
        mask = np.array([1, 1, 1, 1, 0], bool)
        want = ema_smooth(previous_smoothed, [*out.raw_weights.tolist(), 0.0], mask, BETA)
        np.testing.assert_allclose(out.smoothed_weights, want[:4], atol=1e-12)
        np.testing.assert_allclose(out.current_weights, base[:4], atol=1e-12)
        assert out.turnover == pytest.approx(np.abs(want[1:] - base[1:]).sum(), abs=1e-12)
        if previous_obs is None:
            assert out.icm_reward is None
        else:
            expected = reference_icm(previous_obs, previous_action, obs, TINY)
            assert out.icm_reward == pytest.approx(expected, abs=1e-5)
            # ... and not the weights in place of the action:
            wrong = reference_icm(previous_obs, previous_smoothed.astype(np.float32), obs, TINY)
            assert abs(wrong - expected) > 1e-3
        previous_smoothed, previous_obs, previous_action = want, obs, action
        assert state.steps == k + 1


def test_request_order_does_not_move_assets_between_slots(tiny_model: LoadedModel) -> None:
    p = prices_for(3, seed=2)
    _, s1 = decide_one(tiny_model, request_for(tiny_model, ("X", "Y", "Z"), p), None)
    order = [2, 0, 1]
    q = prices_for(3, seed=3)
    straight, s_straight = decide_one(tiny_model, request_for(tiny_model, ("X", "Y", "Z"), q), s1)
    permuted, s_permuted = decide_one(
        tiny_model, request_for(tiny_model, ("Z", "X", "Y"), q[order]), s1
    )
    assert s_permuted.slots == s_straight.slots == ("X", "Y", "Z", "")
    assert permuted.asset_ids == (CASH_ID, "Z", "X", "Y")
    idx = [0, *(i + 1 for i in order)]
    np.testing.assert_allclose(permuted.raw_weights, straight.raw_weights[idx], atol=1e-7)
    np.testing.assert_allclose(
        permuted.smoothed_weights, straight.smoothed_weights[idx], atol=1e-12
    )
    assert permuted.icm_reward == pytest.approx(straight.icm_reward, abs=1e-6)


def test_departed_asset_frees_its_slot_and_its_mass_is_not_inherited(
    tiny_model: LoadedModel,
) -> None:
    _, s1 = decide_one(
        tiny_model, request_for(tiny_model, ("A", "B", "C"), prices_for(3, seed=4)), None
    )
    # B leaves, D arrives: D takes B's slot (the lowest free), without B's smoothed weight.
    p = prices_for(3, seed=5)
    out, s2 = decide_one(tiny_model, request_for(tiny_model, ("A", "D", "C"), p), s1)
    assert s2.slots == ("A", "D", "C", "")
    _, _, raw = expected_step(
        p, [1, 2, 3], renormalize(s1.smoothed * [1, 1, 0, 1, 0], [1] * 4 + [0])
    )
    np.testing.assert_allclose(out.raw_weights, raw[:4], atol=1e-6)
    prev = np.array(s1.smoothed) * [1, 1, 0, 1, 0]
    want = renormalize(BETA * prev + (1 - BETA) * raw, [1, 1, 1, 1, 0])
    np.testing.assert_allclose(out.smoothed_weights, want[:4], atol=1e-12)
    inherited = renormalize(BETA * np.array(s1.smoothed) + (1 - BETA) * raw, [1, 1, 1, 1, 0])
    assert abs(inherited[2] - out.smoothed_weights[2]) > 1e-3
    assert out.icm_reward is None  # the universe changed: not a transition the ICM knows
    # A leaves too and E, F arrive: E takes slot 1, F slot 4; C stays in slot 3.
    out3, s3 = decide_one(
        tiny_model, request_for(tiny_model, ("C", "E", "D", "F"), prices_for(4, seed=6)), s2
    )
    assert s3.slots == ("E", "D", "C", "F")
    assert out3.asset_ids == (CASH_ID, "C", "E", "D", "F")
    assert out3.smoothed_weights.sum() == pytest.approx(1.0, abs=1e-12)
    out4, _ = decide_one(
        tiny_model, request_for(tiny_model, ("C", "E", "D", "F"), prices_for(4, 7)), s3
    )
    assert out4.icm_reward is not None  # same universe again: the ICM answers


def test_a_shrinking_request_without_current_weights_renormalizes_the_survivors(
    tiny_model: LoadedModel,
) -> None:
    _, s1 = decide_one(tiny_model, request_for(tiny_model, ("A", "B"), prices_for(2, seed=8)), None)
    out, s2 = decide_one(tiny_model, request_for(tiny_model, ("B",), prices_for(1, seed=9)), s1)
    held = np.array(s1.smoothed)[[0, 2]]
    np.testing.assert_allclose(out.current_weights, held / held.sum(), atol=1e-12)
    assert s2.slots == ("", "B", "", "")


def test_batch_equals_one_by_one(tiny_model: LoadedModel) -> None:
    """Mixed batch (new, continuing, changed universe, with/without current weights)."""
    _, a = decide_one(tiny_model, request_for(tiny_model, ("A", "B"), prices_for(2, 20)), None)
    _, b = decide_one(tiny_model, request_for(tiny_model, ("B", "C", "D"), prices_for(3, 21)), None)
    _, b = decide_one(tiny_model, request_for(tiny_model, ("B", "C", "D"), prices_for(3, 22)), b)
    inputs = [
        request_for(tiny_model, ("A", "B"), prices_for(2, 23)),
        request_for(tiny_model, ("C", "E"), prices_for(2, 24), np.array([0.5, 0.25, 0.25])),
        request_for(tiny_model, ("N1", "N2", "N3", "N4"), prices_for(4, 25)),
        request_for(tiny_model, ("B", "C", "D"), prices_for(3, 26), np.array([0.4, 0.2, 0.2, 0.2])),
    ]
    states = [a, b, None, b]
    batch = decide_many(tiny_model, inputs, states)
    pairs = zip(batch.outputs, batch.states, inputs, states, strict=True)
    for out, state, inp, prev in pairs:
        one, one_state = decide_one(tiny_model, inp, prev)
        for name in ("raw_weights", "smoothed_weights", "current_weights"):
            np.testing.assert_allclose(getattr(out, name), getattr(one, name), atol=1e-7)
        assert out.turnover == pytest.approx(one.turnover, abs=1e-7)
        assert (out.icm_reward is None) == (one.icm_reward is None)
        assert state.slots == one_state.slots
        assert state.steps == one_state.steps
    assert batch.outputs[3].icm_reward is not None
    assert batch.outputs[1].icm_reward is None


def test_outputs_and_states_are_read_only(tiny_model: LoadedModel) -> None:
    out, state = decide_one(tiny_model, request_for(tiny_model, ("A",), prices_for(1, 30)), None)
    for a in (out.raw_weights, out.smoothed_weights, state.smoothed, state.observation):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 0.5


def test_a_state_from_a_model_with_other_max_assets_restarts(
    tiny_model: LoadedModel, tmp_path
) -> None:
    from allocator.serving import load_model

    wide = load_model(
        write_tiny_model(tmp_path / "wide" / "2", Spec(max_assets=6, window=TINY.window)),
        prefer_cuda=False,
    )
    _, s = decide_one(tiny_model, request_for(tiny_model, ("A", "B"), prices_for(2, 31)), None)
    _, s = decide_one(tiny_model, request_for(tiny_model, ("A", "B"), prices_for(2, 32)), s)
    out, restarted = decide_one(wide, request_for(wide, ("A", "B"), prices_for(2, 33)), s)
    assert restarted.steps == 1
    assert restarted.model == ModelKey("wide", "2", 7)
    np.testing.assert_array_equal(out.smoothed_weights, out.raw_weights)
    assert out.icm_reward is None
    # Same slot count, other name/version: the smoothing continues.
    same = load_model(write_tiny_model(tmp_path / "same" / "3"), prefer_cuda=False)
    out2, continued = decide_one(same, request_for(same, ("A", "B"), prices_for(2, 34)), s)
    assert continued.steps == 3
    assert continued.model == ModelKey("same", "3", TINY.n_slots)
    assert out2.icm_reward is not None
    assert not np.allclose(out2.smoothed_weights, out2.raw_weights)


def test_model_without_icm_never_answers_a_reward(plain_model: LoadedModel) -> None:
    state = None
    for k in range(3):
        out, state = decide_one(
            plain_model, request_for(plain_model, ("A", "B"), prices_for(2, 40 + k)), state
        )
        assert out.icm_reward is None
    # Nothing kept for an ICM that is not there: small states.
    assert state.observation is None
    assert state.action is None
    assert len(state.to_bytes()) < 200
    assert PortfolioState.from_bytes(state.to_bytes()) == state


def test_states_round_trip_through_bytes(tiny_model: LoadedModel) -> None:
    _, s = decide_one(tiny_model, request_for(tiny_model, ("Ä", "B:1"), prices_for(2, 50)), None)
    data = s.to_bytes()
    assert isinstance(data, bytes)
    back = PortfolioState.from_bytes(data)
    assert back == s
    assert back.smoothed.dtype == np.float64
    assert back.observation.dtype == np.float32
    assert back.slots == ("Ä", "B:1", "", "")
    bare = PortfolioState(ModelKey("m", "v", 3), ("a", ""), np.array([1.0, 0, 0]), None, None, 0)
    assert PortfolioState.from_bytes(bare.to_bytes()) == bare
    assert bare != s
    # 20 assets, window 30: the raw observation (2.6 kB) dominates.
    big = PortfolioState(
        ModelKey("m", "7", 21),
        tuple(f"ASSET{i}" for i in range(20)),
        np.full(21, 1 / 21),
        np.zeros(20 * 30 + 42, np.float32),
        np.zeros(21, np.float32),
        12,
    )
    assert len(big.to_bytes()) < 3200
    assert PortfolioState.from_bytes(big.to_bytes()) == big


def test_the_last_answer_travels_in_the_bytes_and_format_1_still_reads() -> None:
    """The last answer round-trips (its request id among the strings, the response raw); a
    format-1 state, written by an older server, still reads, with no last answer."""
    last = LastAnswer("req-Ä-1", bytes(range(16)), b"\x00\x01response\xff")
    s = PortfolioState(
        ModelKey("m", "v", 3), ("a", "b"), np.array([0.2, 0.3, 0.5]), None, None, 4, last
    )
    back = PortfolioState.from_bytes(s.to_bytes())
    assert back == s
    assert back.last == last
    assert back != dataclasses.replace(s, last=None)
    with pytest.raises(StateDecodeError):  # cut inside the response
        PortfolioState.from_bytes(s.to_bytes()[:40])
    # Format 1: the same header with 4 bytes of padding where the response length is now.
    old = dataclasses.replace(s, last=None).to_bytes()
    v1 = old[:2] + bytes([1]) + old[3:]
    assert PortfolioState.from_bytes(v1) == dataclasses.replace(s, last=None)
    assert PortfolioState.from_bytes(v1).last is None


@pytest.mark.parametrize(
    "data",
    [b"", b"junk", b"XX" + bytes(40), None],
)
def test_malformed_state_bytes_are_refused(tiny_model: LoadedModel, data: bytes | None) -> None:
    if data is None:  # a valid state cut short
        _, s = decide_one(tiny_model, request_for(tiny_model, ("A",), prices_for(1, 51)), None)
        data = s.to_bytes()[:-3]
    with pytest.raises(StateDecodeError):
        PortfolioState.from_bytes(data)


ASSETS = [f"S{i}" for i in range(7)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(ASSETS), min_size=1, max_size=4, unique=True),
            st.booleans(),
            st.integers(0, 2**16),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_any_request_sequence_answers_distributions_over_the_request(
    tiny_model: LoadedModel, steps: list[tuple[list[str], bool, int]]
) -> None:
    """Whatever assets come and go, answers are distributions in request order, slots unique."""
    state = None
    for ids, send, seed in steps:
        current = None
        if send:
            g = np.random.default_rng(seed).gamma(1.0, size=len(ids) + 1)
            current = g / g.sum()
        out, state = decide_one(
            tiny_model,
            request_for(tiny_model, tuple(ids), prices_for(len(ids), seed), current),
            state,
        )
        assert out.asset_ids == (CASH_ID, *ids)
        for w in (out.raw_weights, out.smoothed_weights, out.current_weights):
            assert w.shape == (len(ids) + 1,)
            assert np.all(w >= 0)
            assert abs(w.sum() - 1.0) < 1e-9
        assert np.array(state.smoothed).sum() == pytest.approx(1.0, abs=1e-9)
        assert sorted(a for a in state.slots if a) == sorted(ids)
        occupied = np.array([True] + [bool(a) for a in state.slots])
        assert np.all(np.array(state.smoothed)[~occupied] == 0.0)
        assert 0.0 <= out.turnover <= 2.0 + 1e-9
