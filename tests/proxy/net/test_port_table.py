"""Issue 11, hole 4: every worker of `--workers N` gives a broker node the same local port,
whatever order each worker meets the nodes in (the shared PortTable)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from sluice.proxy.net.node_ports import BrokerMap, PortTable


def _learn(table: str, order: list[int], out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    brokers = BrokerMap("127.0.0.1", 20000, shared=PortTable(table))
    out.put({n: brokers.local_endpoint(n, f"broker-{n}", 9092)[1] for n in order})


def test_workers_meeting_nodes_in_opposite_orders_agree(tmp_path: Path) -> None:
    table = PortTable.create(tmp_path)
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_learn, args=(str(table.path), order, out))
        for order in ([1, 2, 3], [3, 2, 1], [2, 3, 1])
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert results[0] == results[1] == results[2]
    assert sorted(results[0].values()) == [20001, 20002, 20003]


def test_without_a_table_order_of_discovery_decides(tmp_path: Path) -> None:
    # What the table prevents: two independent maps disagree when the orders differ.
    a = BrokerMap("127.0.0.1", 20000)
    b = BrokerMap("127.0.0.1", 20000)
    ports_a = {n: a.local_endpoint(n, "h", 1)[1] for n in (1, 2)}
    ports_b = {n: b.local_endpoint(n, "h", 1)[1] for n in (2, 1)}
    assert ports_a != ports_b


def test_fixed_ports_win_over_the_table(tmp_path: Path) -> None:
    table = PortTable.create(tmp_path)
    brokers = BrokerMap("127.0.0.1", 20000, fixed_ports={7: 29999}, shared=table)
    assert brokers.local_endpoint(7, "h", 1) == ("127.0.0.1", 29999)
    assert brokers.local_endpoint(8, "h", 1) == ("127.0.0.1", 20001)
