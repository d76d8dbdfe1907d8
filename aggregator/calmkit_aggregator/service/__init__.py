"""The aggregator service: the gRPC server and its handlers (:mod:`.server`,
:mod:`.handlers`), the wire conversions (:mod:`.wire`, the only modules touching
protobuf), storage backends behind one interface (:mod:`.store`: the interface, its
records and the checks both backends share; :mod:`.storage`: SQLite, embedded;
:mod:`.pg_storage`: PostgreSQL, shared by replicas; columnar batches :mod:`.columns`,
dedupe tables :mod:`.keyset`), the admin client (:mod:`.admin`), rate limits, the
operator commands (:mod:`.cli`: serve, collection, query), and the HTTP endpoints
beside the gRPC port (:mod:`.endpoints`: Prometheus metrics, :mod:`.metrics`, and the
web console, :mod:`.console`, sharing :mod:`.http_endpoint`'s rules). The estimation engine
(calmkit_aggregator's other modules) imports none of this."""
