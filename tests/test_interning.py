"""service/interning.py: one shared value per key, within a bound."""

from __future__ import annotations

from service.interning import SharedValues


def test_callers_with_the_same_key_share_one_value_and_make_it_once() -> None:
    made: list[str] = []
    shared: SharedValues[str, list[str]] = SharedValues(10)

    def make(key: str) -> list[str]:
        made.append(key)
        return [key]

    first, again, other = shared.get("a", make), shared.get("a", make), shared.get("b", make)
    assert first is again and first == ["a"] and other == ["b"]
    assert made == ["a", "b"]


def test_past_the_bound_each_call_gets_a_value_of_its_own() -> None:
    shared: SharedValues[int, list[int]] = SharedValues(2)
    kept = [shared.get(k, lambda k: [k]) for k in (1, 2)]
    assert shared.get(1, lambda k: [k]) is kept[0]
    assert shared.get(3, lambda k: [k]) is not shared.get(3, lambda k: [k])
