# Sample configuration for the kernel_gateway_stream daemon (a traitlets config file).
# Use it with:  kernel-gateway-stream --config=kernel_gateway_stream_config.py
# Every option, with its default and help: docs/configuration.md (or --help-all).
c = get_config()  # noqa: F821

# -- Listening (jupyter_server's own options) ------------------------------------------
c.ServerApp.ip = "127.0.0.1"  # put a TLS-terminating proxy in front to expose it
c.ServerApp.port = 8888
# The token comes from JUPYTER_TOKEN in the environment (see the systemd unit), or:
# c.IdentityProvider.token = "..."
# c.ServerApp.base_url = "/gateway/"
# Serve more of jupyter_server than the kernel APIs (off by default):
# c.StreamServerApp.services = ["api", "auth", "kernels", "kernelspecs", "sessions",
#                               "security", "contents", "files"]

# -- Transcripts ------------------------------------------------------------------------
c.SQLiteTranscriptStore.path = "/var/lib/kernel-gateway-stream/data/transcripts.sqlite3"
c.SQLiteTranscriptStore.max_pending_bytes = 64 * 1024 * 1024  # unwritten records, then gaps
c.SQLiteTranscriptStore.synchronous = "NORMAL"  # FULL also survives power loss
c.SQLiteTranscriptStore.max_bytes_per_kernel = 256 * 1024 * 1024
c.SQLiteTranscriptStore.max_age = 7 * 24 * 3600.0
c.SQLiteTranscriptStore.keep_after_shutdown = 24 * 3600.0

# -- Fan-out ----------------------------------------------------------------------------
c.MemoryBroker.coalesce_window = 0.05  # seconds a burst of output may wait to be merged
c.MemoryBroker.coalesce_max_bytes = 65536
c.GatewayStreamApp.subscriber_max_bytes = 32 * 1024 * 1024  # then close 4008, resume by seq
c.GatewayStreamApp.subscriber_max_lag = 60.0

# -- Security ---------------------------------------------------------------------------
# Environment variables kernels must not inherit, besides the token (cloud credentials...):
# c.GatewayStreamApp.secret_env_vars = ["AWS_SECRET_ACCESS_KEY"]
# c.MappingKernelManager.allow_tracebacks = False  # replace tracebacks on every surface
c.GatewayStreamApp.max_request_bytes = 10 * 1024 * 1024

# -- Operating it -------------------------------------------------------------------------
# c.GatewayStreamApp.log_json = True  # one JSON object per log line
# c.GatewayStreamApp.log_file = "/var/log/kernel-gateway-stream/gateway.log"  # SIGHUP reopens
# /metrics on the main port needs the token (ServerApp.authenticate_prometheus); or serve
# it alone, unauthenticated, on a port of its own for Prometheus:
# c.GatewayStreamApp.metrics_port = 9464
c.GatewayStreamApp.shutdown_drain_timeout = 5.0

# -- Kernels ----------------------------------------------------------------------------
# c.MappingKernelManager.cull_idle_timeout = 3600
# c.MappingKernelManager.cull_interval = 300
