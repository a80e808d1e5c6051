"""CodeRepairRL's control plane: CRDs, pure builders of child objects, and (with kopf) the operator.

Modules that only build or generate (``crds``, ``builders``, ``apidocs``) import neither kopf nor
the Kubernetes client, so ``crl render`` and ``crl crds`` work with the base install.
"""

__version__ = "0.1.0"
