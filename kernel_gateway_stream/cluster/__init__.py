"""Several gateways, one set of kernels, over Redis (see :mod:`.node`).

Imported by the application alone (it makes a :class:`ClusterNode` when
``GatewayStreamApp.redis_url`` is set). It builds on the recording registry, the kernels
and the Redis store; none of those imports it.
"""

from .node import ClusterNode

__all__ = ["ClusterNode"]
