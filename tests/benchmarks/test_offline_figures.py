from benchmarks.bench_vllm_cpu import FANOUT, offline_figures, unit_seeds


def side(speeds: list[float], cpu_s: float, order: list[str], name: str, tokens: int = 1000,
         own_s: float | None = None):
    runs = iter(speeds)

    def run(records: list[dict[str, float]]) -> float:
        order.append(name)
        records.append({"cpu_s": cpu_s, "tokens": tokens} | ({} if own_s is None else {"own_s": own_s, "sampling_s": 20.0}))
        return next(runs)

    return run


def test_the_stage_is_set_against_llm_chat_its_fan_out_and_its_async_api(capsys):
    order: list[str] = []
    figures = offline_figures("1. offline:", {
        "klear sample": side([98.0, 95.0], 0.8, order, "klear"),
        "LLM.chat": side([100.0, 100.0], 0.5, order, "llm"),
        FANOUT: side([105.0, 100.0], 0.4, order, "fanout", tokens=1010),
        "klear sample (async_llm)": side([90.0, 95.0], 0.9, order, "klear-async"),
        "AsyncLLM alone": side([90.0, 100.0], 0.6, order, "async")}, 2)
    # each round starts one side further on
    assert order == ["klear", "llm", "fanout", "klear-async", "async",
                     "llm", "fanout", "klear-async", "async", "klear"]
    assert figures["ratio"] == [0.98, 0.95]
    assert figures[f"klear sample / {FANOUT}"] == [98.0 / 105.0, 0.95]
    assert figures["klear sample (async_llm) / LLM.chat"] == [0.9, 0.95]
    assert figures["klear sample (async_llm) / AsyncLLM alone"] == [1.0, 0.95]
    assert figures["AsyncLLM alone / LLM.chat"] == [0.9, 1.0]
    assert figures["front_end_cpu_s"]["klear sample"] == [0.8, 0.8]
    assert figures["front_end_cpu_s"][FANOUT] == [0.4, 0.4]
    assert figures["completion_tokens"][FANOUT] == [1010, 1010]
    assert figures["same_work"] is True
    printed = capsys.readouterr().out
    assert "klear sample / LLM.chat: median 0.96x" in printed
    assert f"klear sample / {FANOUT}: median 0.94x" in printed
    assert "AsyncLLM alone / LLM.chat: median 0.95x" in printed
    assert "generated the same completion tokens in every run" in printed


def test_without_the_other_sides_only_the_goal_ratio_is_printed(capsys):
    order: list[str] = []
    figures = offline_figures("1. offline:", {"klear sample": side([96.0], 0.8, order, "klear"),
                                              "LLM.chat": side([100.0], 0.5, order, "llm")}, 1)
    assert figures["ratio"] == [0.96]
    printed = capsys.readouterr().out
    assert "AsyncLLM" not in printed and FANOUT not in printed
    assert set(figures) == {"klear sample", "LLM.chat", "front_end_cpu_s", "completion_tokens", "ratio", "same_work"}


def test_a_ratio_over_different_samples_is_called_out(capsys):
    order: list[str] = []
    figures = offline_figures("1. offline:", {"klear sample": side([96.0, 97.0], 0.8, order, "klear", tokens=990),
                                              "LLM.chat": side([100.0, 100.0], 0.5, order, "llm")}, 2)
    assert figures["same_work"] is False
    assert "DIFFERENT completion tokens" in capsys.readouterr().out


def test_the_baseline_draws_the_stages_seeds():
    from klear.common.config import load_config
    from klear.sample.config import SampleConfig
    from klear.sample.units import unit_seed

    seeds = unit_seeds(3, 4)
    assert len(seeds) == 3 and all(len(per_prompt) == 4 for per_prompt in seeds)
    assert seeds[2][1] == unit_seed(load_config(SampleConfig, "tiny-vllm-cpu", []).seed, "q2", 1)
    assert len({s for per_prompt in seeds for s in per_prompt}) == 12


def test_the_stages_own_work_is_printed_with_its_share_of_the_sampling_time(capsys):
    order: list[str] = []
    figures = offline_figures("1. offline:", {"klear sample": side([96.0, 97.0], 0.8, order, "klear", own_s=0.2),
                                              "LLM.chat": side([100.0, 100.0], 0.5, order, "llm")}, 2)
    assert figures["own_work_s"] == {"klear sample": [0.2, 0.2]}  # LLM.chat has no work of its own to count
    printed = capsys.readouterr().out
    assert "klear sample, its sampling thread's own work (shards, bookkeeping), s: median 0.20" in printed
    assert "klear sample, that work's share of its sampling time: median 0.010" in printed
