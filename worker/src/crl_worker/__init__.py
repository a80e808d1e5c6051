"""CodeRepairRL's data plane: tasks, sandboxes, agents, rewards, training and benchmarks.

Runs inside the pods the operator creates, or on one machine from the same config. Imports
nothing of the operator.
"""

__version__ = "0.1.0"
