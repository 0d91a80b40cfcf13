"""The chunked harness (bench.chunked, bench.chunk_client): its long-lived client process
against a real broker, and a `--quick` run through `sluice serve`. No speed is asserted: only
that every side is measured in every pair and reported with its client's own CPU."""

from __future__ import annotations

import pytest

from bench import chunked, targets, workload
from bench.chunk_client import ChunkClient, Timed
from tests.harness.broker import TansuBroker
from tests.harness.ports import free_port


def test_pairs_alternate_which_side_goes_first() -> None:
    assert chunked._order("direct", "x", 0) == ["direct", "x", "x", "direct"]
    assert chunked._order("direct", "x", 1) == ["x", "direct", "direct", "x"]


def test_a_busy_direct_client_is_reported_as_the_possible_cap() -> None:
    run = chunked.Run(chunked.WORKLOADS[1], 10, 200.0)
    busy = Timed(records=10, seconds=1.0, cpu=1.5, thread_cpu=0.95)
    idle = Timed(records=10, seconds=1.0, cpu=0.2, thread_cpu=0.1)
    run.rows["direct"] = chunked.Row(
        produce=[10.0], consume=[10.0], produce_client=[busy], consume_client=[idle]
    )
    text = chunked.report(run)
    assert "direct's produce client kept its Python thread busy 95 %" in text
    assert "consume client" not in text
    assert "| direct | 10 | - | 10 | - | - | 150000.00 / 20000.00 | 95 / 10 |" in text


def test_shapes_split_a_chunk_and_add_up_what_a_record_cost_every_process() -> None:
    run = chunked.Run(chunked.WORKLOADS[1], 1000, 200.0)
    # direct: 1.0 + 0.5 µs a record; the middle adds 0.25 and slows the tail.
    direct = Timed(records=1000, seconds=0.010, cpu=0.001, thread_cpu=0.001, requests=4,
                   rtt_us=2000.0, tail=0.002)
    middle = Timed(records=1000, seconds=0.012, cpu=0.001, thread_cpu=0.001, requests=4,
                   rtt_us=3000.0, tail=0.004)
    run.rows["direct"] = chunked.Row(produce=[1e5], consume=[1e5], produce_client=[direct],
                                     consume_client=[direct], produce_middle=[0.0],
                                     produce_broker=[0.0005])
    run.rows["sluice"] = chunked.Row(produce=[8e4], consume=[1e5], produce_ratio=[0.8],
                                     consume_ratio=[1.0], produce_client=[middle],
                                     consume_client=[middle], produce_middle=[0.00025],
                                     produce_broker=[0.0005])
    text = chunked.report(run)
    # records/Produce, round trip, loop, tail, records/Fetch, round trip, CPU, sum, ratio
    assert ("| direct | 250 | 2.00 | 8.0 | 2.0 | 250 | 2.00 "
            "| 1.00 / 0.50 / 0.00 | 1.50 | 1.00 |") in text
    assert ("| sluice | 250 | 3.00 | 8.0 | 4.0 | 250 | 3.00 "
            "| 1.00 / 0.50 / 0.25 | 1.75 | 0.86 |") in text


def test_the_broker_is_found_by_the_port_it_listens_on(broker: TansuBroker) -> None:
    assert broker.process is not None
    assert targets.listener_pid(broker.bootstrap) == broker.process.pid
    assert targets.listener_pid(f"127.0.0.1:{free_port()}") is None


def test_bad_arguments_are_refused_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--variants", "direct,nope"], ["--pairs", "0"], ["--workload", "3"]):
        with pytest.raises(SystemExit) as exc:
            chunked.main(argv)
        assert exc.value.code == 2
    assert "nope" in capsys.readouterr().err


def test_one_client_process_produces_chunks_and_times_consumers_from_their_first_record(
    broker: TansuBroker,
) -> None:
    topic = workload.make_topic(broker.bootstrap, partitions=1)
    with ChunkClient(broker.bootstrap, chunk=3000, shapes=True) as client:
        pid = client.pid
        client.prepare(topic)
        chunks = [client.produce(topic, 3000) for _ in range(2)]
        read = client.consume(topic, 6001)
        assert client.pid == pid and client.proc.poll() is None  # the same process throughout
        for t in chunks:
            assert t.records == 3000 and t.seconds > 0 and t.cpu > 0
            # --shapes: librdkafka's statistics counted the chunk's Produce requests.
            assert 1 <= t.requests <= 3000 and t.rtt_us > 0
            # flush()'s tail is part of the chunk's span, after the produce() loop.
            assert 0 < t.tail < t.seconds
        assert read.requests >= 1 and read.rtt_us > 0
        # The clock starts when the first record is there: it counts the 6 000 after it.
        assert read.records == 6000 and read.seconds > 0
        with pytest.raises(RuntimeError, match=r"records must be 1\.\.3000"):
            client.produce(topic, 3001)
    assert client.proc.returncode == 1


@pytest.mark.serial
def test_quick_run_measures_every_variant_in_every_pair(
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = ["direct", "aa", "sluice", "mask-fetch"]
    assert chunked.main(["--quick", "--variants", ",".join(names)]) == 0
    out = capsys.readouterr()
    assert out.err.count(" pair ") == 2 * (len(names) - 1)
    for name in names:
        row = next(line for line in out.out.splitlines() if line.startswith(f"| {name} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == name and float(cells[1]) > 0 and float(cells[3]) > 0
        if name != "direct":
            assert "(" in cells[2] and "(" in cells[4]  # two pairs: a median and a range
        assert (cells[5] != "-") is (name in ("sluice", "mask-fetch"))
        produce_cpu, consume_cpu = (float(x) for x in cells[6].split(" / "))
        assert produce_cpu > 0 and consume_cpu > 0
    assert "Direct (median of its 6 pair sides)" in out.out


def test_a_baseline_tree_adds_a_run_of_each_sluice_variant() -> None:
    # --baseline DIR (chunked and bench_proxy): each Sluice variant also runs from DIR, as
    # VARIANT@base, next to its own; the other middles and direct run once.
    from bench.rig import with_baseline

    assert with_baseline(["direct", "relay", "mask-produce", "sluice"]) == [
        "direct", "relay", "mask-produce", "mask-produce@base", "sluice", "sluice@base"]


def test_own_broker_variants_each_get_a_broker_of_their_own() -> None:
    # aa-own: a direct client of a second broker (no middle), the control for the variants
    # whose broker is their own (relay, sluice-own); every other variant shares direct's.
    from bench.rig import rig

    with rig(["direct", "aa", "aa-own", "sluice-own"], [], "", "tansu") as points:
        main = points["direct"].broker
        assert points["aa"].broker == main
        own = points["aa-own"]
        assert own.broker != main and own.target.bootstrap == own.broker
        assert own.target.pid is None
        assert points["sluice-own"].broker not in (main, own.broker)
        assert points["sluice-own"].target.pid is not None
        for point in points.values():
            topic = workload.make_topic(point.target.bootstrap, partitions=1)
            workload.delete_topic(point.broker, topic)
