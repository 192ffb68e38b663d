"""The rule for a verdict from paired repeats: the direction by a sign test, the size apart."""

import pytest

from minicb.repeats import ALPHA, MIN_REPEATS, NO_DIRECTION, Repeats, sign_test_p


def test_five_agreeing_repeats_give_a_direction_even_when_the_size_is_unsettled():
    # static batching's gain in five rounds, every one at least 1.11x, the spread wider than
    # the gain: the old rule called this noise
    gain = Repeats.of([1.11, 1.53, 1.15, 1.12, 1.20])
    assert gain.p_value() == pytest.approx(1 / 16) and gain.direction() == 1
    assert gain.verdict("faster", "slower") == "faster"
    assert gain.size_within_spread()
    assert gain.describe("faster", "slower") == (
        "faster in every one of 5 alternated repeats (at least 1.11×); the size, 1.15× "
        "(1.11–1.53), is within the spread")


def test_three_up_two_down_give_no_direction_however_large_the_median():
    mixed = Repeats.of([1.9, 2.0, 2.1, 0.9, 0.95])
    assert mixed.sides() == (3, 2) and mixed.p_value() == 1.0
    assert mixed.direction() == 0 and mixed.verdict("faster", "slower") == NO_DIRECTION
    assert mixed.describe("faster", "slower").startswith(
        "no direction from 5 alternated repeats (3 above and 2 below, sign test p = 1)")


def test_fewer_than_five_repeats_never_give_a_direction():
    assert MIN_REPEATS == 5 and sign_test_p(4, 0) > ALPHA >= sign_test_p(5, 0)
    clean_loss = Repeats.of([0.65, 0.76, 0.77])
    assert clean_loss.direction() == 0 and not clean_loss.size_within_spread()
    assert clean_loss.describe("paid", "cost").startswith(
        "no direction from 3 alternated repeats (5 agreeing are the fewest)")
    with pytest.raises(ValueError, match="at least one"):
        Repeats.of([])


def test_a_loss_in_every_repeat_reads_at_most_its_weakest_ratio():
    loss = Repeats.of([0.70, 0.72, 0.75, 0.71, 0.74])
    assert loss.verdict("paid", "cost") == "cost"
    assert loss.describe("paid", "cost") == (
        "cost in every one of 5 alternated repeats (at most 0.75×); the size, 0.72× "
        "(0.70–0.75), is beyond the spread")


def test_one_dissent_is_allowed_from_nine_repeats_and_the_count_is_named():
    assert sign_test_p(8, 1) == pytest.approx(0.0390625)
    eight_of_nine = Repeats.of([1.2] * 8 + [0.9])
    assert eight_of_nine.direction() == 1
    assert eight_of_nine.describe("higher", "lower").startswith(
        "higher in 8 of 9 alternated repeats (sign test p = 0.039);")
    assert Repeats.of([1.2] * 6 + [0.9]).direction() == 0          # 6 of 7: p = 0.125


def test_a_repeat_at_the_reference_counts_for_neither_side_and_a_reference_can_move():
    assert Repeats.of([1.0, 1.2, 1.3, 1.1, 1.4, 1.2]).sides() == (5, 0)
    assert Repeats.of([6.9, 7.0, 7.05, 6.95, 7.1]).direction(reference=8.0) == -1
    assert str(Repeats.of([1.07, 1.41, 1.16])) == "1.16 (1.07–1.41)"
