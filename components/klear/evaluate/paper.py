"""The paper's Table 1 (Klear-Reasoner-8B, arXiv 2508.07629): AIME/HMMT avg@64, LiveCodeBench avg@8, percent."""

from __future__ import annotations

TABLE1: dict[str, dict[str, float]] = {
    "paper SFT": {"aime24": 75.6, "aime25": 70.1, "hmmt_feb_2025": 57.6, "livecodebench_v5": 58.5,
                  "livecodebench_v6": 49.6},
    "paper RL 32K": {"aime24": 83.2, "aime25": 75.6, "hmmt_feb_2025": 60.3, "livecodebench_v5": 61.6,
                     "livecodebench_v6": 53.1},
    "paper RL 64K YaRN 2.5": {"aime24": 90.5, "aime25": 83.2, "hmmt_feb_2025": 70.8, "livecodebench_v5": 66.0,
                              "livecodebench_v6": 58.1},
}
