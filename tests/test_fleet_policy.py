"""The fleet's routing policy (tailgate/fleet/policy.py), the one `serve --replicas` and `sim
--replicas` share: longest cached prefix within a load threshold, else least loaded."""

from __future__ import annotations

import pytest

from tailgate.fleet.policy import BLOCK, RouterPolicy, chain


def prompt(head: int, own: int, n_head: int = 64, n_own: int = 32) -> list[int]:
    return [head * 1000 + i for i in range(n_head)] + [head * 1000 + 500 + own * 100 + i for i in range(n_own)]


def test_a_prompt_goes_where_its_prefix_was_sent_while_loads_are_within_the_threshold():
    p = RouterPolicy("prefix", imbalance=2)
    first, why = p.choose(prompt(1, 0), {"a": 0, "b": 0})
    assert why == "least-cached"
    other = "b" if first == "a" else "a"
    loads = {first: 2, other: 0}  # busier by exactly the threshold: the cache still wins
    assert p.choose(prompt(1, 1), loads) == (first, "prefix")
    assert p.matched(prompt(1, 2), first) == 64 and p.matched(prompt(1, 2), other) == 0


def test_a_cached_replica_busier_than_the_threshold_loses_to_the_least_loaded():
    p = RouterPolicy("prefix", imbalance=2)
    first, _ = p.choose(prompt(1, 0), {"a": 0, "b": 0})
    other = "b" if first == "a" else "a"
    assert p.choose(prompt(1, 1), {first: 3, other: 0}) == (other, "imbalance")
    # the prompt now lives on both: the longer match (with its own tokens) is where it was just sent
    assert p.matched(prompt(1, 1), other) == 96


def test_different_prefixes_spread_over_equally_loaded_replicas():
    p = RouterPolicy("prefix")
    got = [p.choose(prompt(h, 0), {"a": 0, "b": 0, "c": 0})[0] for h in range(6)]
    assert sorted(got) == ["a", "a", "b", "b", "c", "c"]


def test_new_prefixes_behind_a_shared_header_spread_over_both_replicas_and_repeats_stay_with_theirs():
    """Issue 44: one request at a time, six long prompts that share only a chat template's header
    all went to one replica (the header's block matched there); the other idled."""
    p = RouterPolicy("prefix", seed=1)
    header = "<start_of_turn>user\n"
    texts = [header + f"Document {i}: " + f"lorem {i} ipsum " * 20 for i in range(6)]
    placed = {t: p.choose(t + "Summarize.", {"a": 0, "b": 0}) for t in texts}
    where = [rid for rid, _ in placed.values()]
    assert sorted(where) == ["a", "a", "a", "b", "b", "b"], placed
    assert all(why in ("least-cached", "least-loaded") for _, why in placed.values())
    for t, (rid, _) in placed.items():  # a repeat goes where its prefix lives
        assert p.choose(t + "List the key points.", {"a": 0, "b": 0}) == (rid, "prefix")


def test_the_longest_match_wins_over_a_shorter_one():
    p = RouterPolicy("prefix")
    p.record(prompt(1, 0)[:BLOCK], "a")  # one block of the prefix
    p.record(prompt(1, 0), "b")  # all of it
    assert p.choose(prompt(1, 5), {"a": 0, "b": 1}) == ("b", "prefix")


def test_least_loaded_ignores_caches_and_random_is_seeded():
    p = RouterPolicy("least-loaded")
    p.record(prompt(1, 0), "a")
    assert p.choose(prompt(1, 1), {"a": 1, "b": 0}) == ("b", "least-loaded")
    picks = [RouterPolicy("random", seed=3).choose([1], {"a": 0, "b": 0, "c": 0})[0] for _ in range(3)]
    assert len(set(picks)) == 1  # same seed, same pick
    r = RouterPolicy("random", seed=3)
    assert {r.choose([i], {"a": 0, "b": 0, "c": 0})[0] for i in range(40)} == {"a", "b", "c"}


def test_a_replica_forgets_its_least_recently_routed_blocks_past_its_capacity_and_a_dead_one_everything():
    p = RouterPolicy("prefix", capacity=4)  # 4 blocks = one 64-token prefix
    p.record(prompt(1, 0, n_own=0), "a")
    p.record(prompt(2, 0, n_own=0), "a")
    assert p.matched(prompt(1, 0), "a") == 0 and p.matched(prompt(2, 0), "a") == 64
    p.forget("a")
    assert p.matched(prompt(2, 0), "a") == 0


def test_text_prompts_match_by_characters_and_only_whole_blocks_count():
    p = RouterPolicy("prefix")
    system = "You are a careful assistant. " * 4  # 116 characters: 7 whole blocks
    p.record(system + "What is 2+2?", "b")
    assert p.choose(system + "Name a color.", {"a": 0, "b": 0}) == ("b", "prefix")
    assert len(chain("x" * (BLOCK - 1))) == 0 and p.choose("unrelated", {"a": 0, "b": 0})[1] == "least-loaded"


def test_an_unknown_router_is_refused_naming_the_value_and_the_grammar():
    with pytest.raises(
        ValueError, match=r"router 'nearest' not recognized \(accepted: prefix \| least-loaded \| random\)"
    ):
        RouterPolicy("nearest")
    with pytest.raises(ValueError, match="no replica"):
        RouterPolicy().choose([1], {})
