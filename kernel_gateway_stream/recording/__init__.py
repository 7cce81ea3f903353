"""Recording: one recorder (or follower) per kernel, and the registry that keeps them.

* :mod:`.recorder`: numbers, appends and publishes one kernel's records, in the role
  :mod:`..core.ownership` gives it (owner, follower, handing over, closed);
* :mod:`.follower`: the empty IOPub source of a kernel another node records;
* :mod:`.activity`: jupyter_server's ``last_activity`` and ``execution_state``, kept from
  the records;
* :mod:`.registry`: one recorder per kernel of the server's kernel manager (its options
  are the configuration section ``RecorderRegistry``, formerly ``TapManager``).

Imported by the cluster node (through the registry it is handed), the executions, the
handlers, the application and the old names in :mod:`..tap`; imports :mod:`..core`,
:mod:`..kernels`, :mod:`..broker` and :mod:`..stores`, never the cluster.
"""
