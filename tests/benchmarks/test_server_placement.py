import os
import subprocess
import sys

import pytest

from benchmarks.bench_vllm_cpu import on_cpus, split_cpus


def test_the_server_gets_the_last_cpus_and_the_clients_the_rest():
    assert split_cpus({0, 1}, 1) == ({1}, {0})
    assert split_cpus({4, 5, 6, 7}, 2) == ({6, 7}, {4, 5})
    assert split_cpus({3, 0, 2}, 1) == ({3}, {0, 2})


def test_zero_server_cpus_means_both_share_every_cpu():
    assert split_cpus({0, 1, 2}, 0) == ({0, 1, 2}, {0, 1, 2})


@pytest.mark.parametrize("server", [2, 3, -1])
def test_a_split_that_leaves_the_clients_nothing_is_refused(server):
    with pytest.raises(SystemExit, match=f"--server-cpus {server}: this process may use 2 CPUs"):
        split_cpus({0, 1}, server)


def test_a_process_started_on_cpus_runs_there_and_the_caller_gets_its_cpus_back():
    available = os.sched_getaffinity(0)
    if len(available) < 2:
        pytest.skip("needs two CPUs to tell a placement from none")
    last = max(available)
    with on_cpus({last}):
        seen = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                              capture_output=True, text=True, check=True).stdout
    assert seen.strip() == f"[{last}]"
    assert os.sched_getaffinity(0) == available
