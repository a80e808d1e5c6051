"""The pieces every rollout shares, below both the benchmark runner and the trainer: the model
endpoint and policies, the sandboxes (crl_worker.rollout.setup), the attempt results files
(crl_worker.rollout.results) and progress reporting to the operator (crl_worker.rollout.report).
"""
