"""The benchmark runner: a suite, the agent, evaluation, results and a summary."""
