# Sample configuration for one node of several sharing Redis (a traitlets config file).
# Use it on every node:  kernel-gateway-stream --config=kernel_gateway_stream_cluster_config.py
# Every option, with its default and help: docs/configuration.md (or --help-all).
c = get_config()  # noqa: F821

# -- Listening: behind the load balancer, each node on its own address ---------------------
c.ServerApp.ip = "0.0.0.0"  # with a token (JUPYTER_TOKEN), the same on every node
c.ServerApp.port = 8888

# -- Redis: transcripts, record bus, kernel directory, leases ----------------------------
# Redis must ask for a password (requirepass or an ACL) and be out of the kernels' reach:
# a node refuses to start on a Redis that answers without one. Give the URL, password
# included, in the KGS_REDIS_URL environment variable, never here (kernels may read this
# file) nor on the command line (every local user reads it in /proc/<pid>/cmdline):
#   KGS_REDIS_URL='redis://:<password>@redis.internal:6379/0'   (rediss:// for TLS)
# And the cluster secret, the same on every node (16 characters or more), in
# KGS_CLUSTER_SECRET: nodes sign their URLs and the kernel directory with it.
# c.ClusterNode.allow_unauthenticated_redis = False  # True only if no kernel reaches Redis
c.RedisTranscriptStore.key_prefix = "kgs:"  # one prefix per cluster sharing this Redis
c.RedisTranscriptStore.max_records_per_kernel = 1_000_000  # XADD MAXLEN ~
c.RedisTranscriptStore.max_pending_bytes = 64 * 1024 * 1024  # unwritten records, then gaps
c.RedisTranscriptStore.reserve_ahead = 1000  # numbers a takeover skips (in its gap record)

# -- Ownership and takeover ---------------------------------------------------------------
c.ClusterNode.lease_ttl = 10.0  # seconds after its owner dies that a kernel is taken over
c.ClusterNode.sync_interval = 1.0  # lease renewal and directory pass; at most lease_ttl / 3
c.ClusterNode.bus_block = 0.5  # seconds one XREAD of the record bus waits
# c.ClusterNode.node_name = "gateway-1"  # default: host name, process id, random suffix

# Every node must reach every kernel's ports (ZMQ): kernels bind an address the other
# nodes reach, e.g. for local kernels:
# c.KernelManager.ip = "10.0.0.5"
