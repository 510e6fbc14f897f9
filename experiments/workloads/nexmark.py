"""nexmark: a Nexmark-style query with a window and a join — bids per auction per window,
joined with the auction's details.

    bids -> key_by(auction) -> window(size, count) -> join(auctions keyed by id) -> sink

Bid i: auction (i * 2654435761 >> 7) % auctions (an uneven spread), price 100 + (i * 31) % 900,
event time i (increasing, so no bid is late). Auction a: seller a % 50, category a % 10. Output records:
{"auction", "window", "bids", "category", "seller"}.

Parameters: bids (default 200,000), auctions (1,000), window (1,000 time units), output.
"""

import nosync as ns


def bid(i: int) -> dict:
    return {"auction": ((i * 2654435761) >> 7) % AUCTIONS[0], "price": 100 + (i * 31) % 900, "ts": i}


def auction(a: int) -> dict:
    return {"id": a, "seller": a % 50, "category": a % 10}


AUCTIONS = [1000]


def build(args: dict) -> ns.Pipeline:
    n_bids = int(args.get("bids", 200_000))
    AUCTIONS[0] = int(args.get("auctions", 1000))
    size = int(args.get("window", 1000))
    p = ns.Pipeline("nexmark")
    bids = p.source(ns.sources.Generator(records=n_bids, fn=bid), name="bids")
    auctions = p.source(ns.sources.Generator(records=AUCTIONS[0], fn=auction), name="auctions")
    per_window = bids.key_by(lambda b: b["auction"], name="by_auction").window(
        size, lambda b: b["ts"], int, lambda n, _: n + 1, name="bids_per_window"
    )
    joined = per_window.join(auctions.key_by(lambda a: a["id"], name="auction_by_id"), name="with_auction")
    rows = joined.map(
        lambda kv: {
            "auction": kv[0],
            "window": kv[1][0][0],
            "bids": kv[1][0][1],
            "category": kv[1][1]["category"],
            "seller": kv[1][1]["seller"],
        },
        name="rows",
    )
    rows.sink(ns.sinks.Files(args.get("output", "nexmark-out"), format="jsonl"))
    return p
