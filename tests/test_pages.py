"""Paged KV bookkeeping: atomic two-pool reservation, sliding release, pages return."""

from __future__ import annotations

import pytest

from tailgate.engine.pages import KVBook, PagePool, SeqPages, pool_pages


def test_pages_return_to_both_pools_when_a_sequence_finishes():
    book = KVBook(global_pages=20, local_pages=20, window=64)
    seq = SeqPages()
    assert book.reserve(seq, 100)  # 7 pages in each pool
    assert (book.glob.used, book.local.used) == (7, 7)
    book.advance(seq, 100)
    book.free(seq)
    assert (book.glob.used, book.local.used) == (0, 0)


def test_sliding_pages_are_released_past_the_window():
    book = KVBook(global_pages=40, local_pages=40, window=64)
    seq = SeqPages()
    assert book.reserve(seq, 200)
    book.advance(seq, 79)
    assert seq.released == 0  # page 0 holds 0..15; a query at 79 still sees key 16 > 79 - 64
    book.advance(seq, 1)  # frontier 80: (0+1)*16 + 64 <= 80
    assert seq.released == 1 and seq.local_pages[0] == 0
    book.advance(seq, 120)  # frontier 200: pages 0..7 released
    assert seq.released == 8
    assert book.local.used == 13 - 8 and book.glob.used == 13
    book.free(seq)
    assert (book.glob.used, book.local.used) == (0, 0)


def test_a_reservation_that_does_not_fit_leaves_both_pools_unchanged():
    book = KVBook(global_pages=11, local_pages=4, window=64)  # 10 and 3 usable pages
    seq = SeqPages()
    before = (book.glob.available, book.local.available)
    assert not book.reserve(seq, 64)  # needs 4 local pages, only 3
    assert (book.glob.available, book.local.available) == before
    assert seq.global_pages == [] and seq.reserved == 0
    assert book.reserve(seq, 48)
    assert not book.reserve(seq, 200)  # global side fails now
    assert (book.glob.available, book.local.available) == (7, 0)


def test_the_padding_page_is_never_handed_out():
    pool = PagePool(5, "global")
    pages = pool.take(4)
    assert 0 not in pages and pool.take(1) is None


def test_pool_sizes_follow_context_slots_and_window():
    assert pool_pages(2048, 4, None) == {"global": 4 * 128 + 1}
    assert pool_pages(2048, 4, 512) == {"global": 513, "local": 4 * 33 + 128 + 1}


def test_a_kv_budget_gives_the_global_pool_what_the_sliding_pool_leaves():
    from tailgate.engine.pages import budget_pool_pages, pool_pages

    tb = {"global": 1000, "local": 5000}  # bytes per token across each family's layers
    fixed = pool_pages(512, 4, 256, 2)["local"] * 16 * 5000
    out = budget_pool_pages(fixed + 100 * 16 * 1000 + 999, tb, 512, 4, 256, 2)
    assert out == {"global": 101, "local": pool_pages(512, 4, 256, 2)["local"]}
    with pytest.raises(ValueError, match=r"TAILGATE_KV_CACHE_MB=.*cannot hold one 512-token request .* MiB"):
        budget_pool_pages(fixed + 16 * 16 * 1000, tb, 512, 4, 256, 2)  # 16 pages < 32 + 1 needed
