"""The trainer: agent-in-the-loop GRPO on TRL, DeepSpeed and accelerate (docs/training.md).

Kept import-free on purpose: the torch-free modules (``launch``, ``report``, ``errors``,
``curriculum``) are imported by the operator and the CLI, which never install torch.
"""
