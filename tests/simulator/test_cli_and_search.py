"""`mindmotor simulate` as a user runs it, the trace loader, cluster descriptions and `--search`."""

from __future__ import annotations

import json

import pytest

from mindmotor.cli import main
from mindmotor.simulator import ClusterSpec, TraceRequest, load_trace
from mindmotor.simulator.report import SLO
from mindmotor.simulator.search import layouts, search


def write_trace(tmp_path, rows, header="arrival_s,prompt_tokens,output_tokens"):
    path = tmp_path / "trace.csv"
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_simulate_json_on_a_csv(tmp_path, capsys):
    trace = write_trace(tmp_path, [(i * 0.05, 200 + i, 10 + i % 7) for i in range(30)])
    assert main(["simulate", "--trace", str(trace), "--prefill", "1", "--decode", "2", "--model", "llama2-7b",
                 "--slo-ttft", "1", "--slo-tpot", "0.1", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["requests"] == 30 and s["cluster"]["roles"] == {"mixed": 0, "prefill": 1, "decode": 2}
    assert s["handoffs"] == 30 and s["output_tokens"] == sum(10 + i % 7 for i in range(30))
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert s[key]["p50"] <= s[key]["p90"] <= s[key]["p99"]
    assert 0 <= s["goodput_fraction"] <= 1 and "utilization_mean" in s and "kv_usage_peak" in s


def test_simulate_table_and_cluster_file(tmp_path, capsys):
    trace = write_trace(tmp_path, [(0.0, 100, 5), (0.1, 50, 3)])
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"mixed": 2, "device": "A100-80G", "model": "llama2-7b", "routing": "round_robin"}))
    assert main(["simulate", "--trace", str(trace), "--cluster", str(cluster)]) == 0
    text = capsys.readouterr().out
    assert "2 instances (2 mixed" in text and "A100-80G" in text and "TTFT ms" in text


@pytest.mark.parametrize("argv, message", [
    (["--cluster", "/nonexistent.json"], "cannot read cluster"),
    (["--instances", "0"], "no instance"),
    (["--routing", "least_load", "--prefill", "1"], "needs both"),
    (["--device", "910Z"], "unknown device"),
    (["--search"], "needs --slo-ttft"),
    (["--frontend-overhead-ms", "-1"], "must not be negative"),
])
def test_bad_input_is_a_clear_error(tmp_path, argv, message, capsys):
    trace = write_trace(tmp_path, [(0.0, 100, 5)])
    assert main(["simulate", "--trace", str(trace), *argv]) == 2
    assert message in capsys.readouterr().err


def test_frontend_overhead_ms_moves_ttft_by_that_much_and_overrides_a_cluster_file(tmp_path, capsys):
    """`--frontend-overhead-ms` (what benchmarks/sim_vs_realtime.py feeds its measurement through):
    one request alone, so its TTFT is the overhead plus its prefill; over a cluster file's value.
    Without the flag, the default is ClusterSpec's (the last measurement)."""
    from mindmotor.simulator.cluster import FRONTEND_OVERHEAD_S

    trace = write_trace(tmp_path, [(0.0, 100, 5)])
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"mixed": 1, "model": "llama2-7b", "frontend_overhead_s": 0.5}))

    def ttft(*argv) -> float:
        assert main(["simulate", "--trace", str(trace), "--cluster", str(cluster), "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out)["ttft_s"]["p50"]

    engine_alone = ttft("--frontend-overhead-ms", "0")
    assert ttft("--frontend-overhead-ms", "7.5") == pytest.approx(engine_alone + 0.0075)
    assert ttft("--frontend-overhead", "0.0075") == pytest.approx(engine_alone + 0.0075)
    assert ttft() == pytest.approx(engine_alone + 0.5)                      # the file's own
    cluster.write_text(json.dumps({"mixed": 1, "model": "llama2-7b"}))
    assert ttft() == pytest.approx(engine_alone + FRONTEND_OVERHEAD_S)


def test_frontend_overhead_flags_are_exclusive(tmp_path, capsys):
    trace = write_trace(tmp_path, [(0.0, 100, 5)])
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(trace), "--frontend-overhead-ms", "5", "--frontend-overhead", "0.005"])
    assert "not allowed with" in capsys.readouterr().err


def test_trace_loader(tmp_path):
    azure = write_trace(tmp_path, [(10.0, 5, 2), (12.0, 6, 3), (20.0, 7, 4)],
                        header="arrived_at,num_prefill_tokens,num_decode_tokens")
    rows = load_trace(azure)
    assert rows[0] == TraceRequest(0.0, 5, 2) and rows[-1].arrival_s == 10.0
    # Rescaled to 1 req/s: 2 gaps over 2 s, the shape of the arrivals kept.
    assert [r.arrival_s for r in load_trace(azure, rate=1.0)] == pytest.approx([0.0, 0.4, 2.0])
    assert len(load_trace(azure, start_s=11.0, duration_s=5.0)) == 1
    with pytest.raises(ValueError, match="expected columns"):
        load_trace(write_trace(tmp_path, [(1, 2)], header="a,b"))
    with pytest.raises(ValueError, match=":3"):
        load_trace(write_trace(tmp_path, [(0, 5, 2), (1, "x", 2)]))


def test_the_azure_trace_is_found_beside_the_repository():
    rows = load_trace(duration_s=60)
    assert len(rows) > 100 and rows[0].arrival_s == 0.0


def test_search_finds_the_fewest_cards_and_is_tighter_with_a_stricter_slo():
    trace = [TraceRequest(i * 0.02, 400, 30) for i in range(80)]
    base = ClusterSpec(model="llama2-7b")
    loose = search(base, trace, SLO(ttft_s=60.0), max_instances=4)
    assert loose["found"] and loose["best"]["cards"] == 1
    strict = search(base, trace, SLO(ttft_s=0.3, tpot_s=0.05), max_instances=6, pd=True)
    assert strict["found"] and strict["best"]["cards"] > 1
    smaller = [t for t in strict["tried"] if t["cards"] < strict["best"]["cards"]]
    assert smaller and all(t["goodput_fraction"] < 0.9 for t in smaller)
    assert layouts(3, pd=True) == [(3, 0, 0), (0, 1, 2), (0, 2, 1)]


def test_cluster_descriptions_are_checked():
    with pytest.raises(ValueError, match="not both"):
        ClusterSpec(mixed=1, prefill=1, decode=1)
    with pytest.raises(ValueError, match="needs both"):
        ClusterSpec(mixed=0, prefill=2)
    with pytest.raises(ValueError, match="routing"):
        ClusterSpec(routing="random")
    assert ClusterSpec(mixed=0, prefill=2, decode=3, tp=2).cards == 10
