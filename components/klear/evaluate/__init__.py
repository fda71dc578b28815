"""Stage 6, evaluation: AIME24/AIME25/HMMT25 avg@64 and LiveCodeBench v5/v6 avg@8 under the paper's protocol,
judged by klear.judge, with error bars and a report (Markdown, self-contained HTML) beside the paper's Table 1.

    from klear.evaluate.stage import run
    report = run(["sft=s3://runs/r1/sample-sft", "rl=s3://runs/r1/sample-rl"], "s3://runs/r1/evaluate", config)
"""
