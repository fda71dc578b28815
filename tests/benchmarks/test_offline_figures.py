from benchmarks.bench_vllm_cpu import offline_figures


def side(speeds: list[float], cpu_s: float, order: list[str], name: str):
    runs = iter(speeds)

    def run(cpu: list[float]) -> float:
        order.append(name)
        cpu.append(cpu_s)
        return next(runs)

    return run


def test_the_stage_is_set_against_llm_chat_and_its_async_api_against_both(capsys):
    order: list[str] = []
    figures = offline_figures("1. offline:", {
        "klear sample": side([98.0, 95.0], 0.8, order, "klear"),
        "LLM.chat": side([100.0, 100.0], 0.5, order, "llm"),
        "klear sample (async_llm)": side([90.0, 95.0], 0.9, order, "klear-async"),
        "AsyncLLM alone": side([90.0, 100.0], 0.6, order, "async")}, 2)
    # each round starts one side further on
    assert order == ["klear", "llm", "klear-async", "async", "llm", "klear-async", "async", "klear"]
    assert figures["ratio"] == [0.98, 0.95]
    assert figures["klear sample (async_llm) / LLM.chat"] == [0.9, 0.95]
    assert figures["klear sample (async_llm) / AsyncLLM alone"] == [1.0, 0.95]
    assert figures["AsyncLLM alone / LLM.chat"] == [0.9, 1.0]
    assert figures["front_end_cpu_s"] == {"klear sample": [0.8, 0.8], "LLM.chat": [0.5, 0.5],
                                          "klear sample (async_llm)": [0.9, 0.9], "AsyncLLM alone": [0.6, 0.6]}
    printed = capsys.readouterr().out
    assert "klear sample / LLM.chat: median 0.96x" in printed
    assert "AsyncLLM alone / LLM.chat: median 0.95x" in printed


def test_without_the_async_sides_only_the_goal_ratio_is_printed(capsys):
    order: list[str] = []
    figures = offline_figures("1. offline:", {"klear sample": side([96.0], 0.8, order, "klear"),
                                              "LLM.chat": side([100.0], 0.5, order, "llm")}, 1)
    assert figures["ratio"] == [0.96]
    assert "AsyncLLM" not in capsys.readouterr().out
    assert set(figures) == {"klear sample", "LLM.chat", "front_end_cpu_s", "ratio"}
