"""Operator-side client of the aggregator service: create, list, close collections
and query marginals (the ``calmkit collection`` and ``calmkit query`` commands)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calmkit_client import Schema
from calmkit_client import wire as client_wire
from calmkit_client.collector import RetryPolicy, call_with_retry, open_channel
from calmkit_client.wire import CollectionInfo, MarginalAnswer

__all__ = ["AdminClient"]


class AdminClient:
    """Admin calls with the server's bearer ``token`` (None: a loopback server
    without a token file); ``root_certificates`` (PEM) for a TLS server."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        root_certificates: bytes | None = None,
    ) -> None:
        self._channel = open_channel(address, root_certificates)
        self._stub = client_wire.aggregator_stub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._retry = retry or RetryPolicy()

    def _call(self, method: str, request: Any) -> Any:
        return call_with_retry(getattr(self._stub, method), request, self._retry, self._metadata)

    def create_collection(
        self,
        schema: Schema,
        epsilon: float,
        expected_n: int,
        k: int,
        *,
        reconstruction: str = "local",
        **options: Any,
    ) -> CollectionInfo:
        """Create a collection (options: collection_id, theta, views, m, l, seed,
        planner ("pipeline" or "paper"), pilot (share of users in the pilot phase),
        max_reports (the report cap; 0: 2 x expected_n),
        admission ((scheme, key): every report needs an admission ticket));
        ``reconstruction``: the one the pipeline planner plans for, "local" or "global"
        (queries may still ask for either). The result carries the submit token, shown
        only this once."""
        req = client_wire.create_request(
            schema, epsilon, expected_n, k, reconstruction=reconstruction, **options
        )
        return client_wire.collection_from_proto(self._call("CreateCollection", req))

    def get_collection(self, collection_id: str) -> CollectionInfo:
        ref = client_wire.collection_ref(collection_id)
        return client_wire.collection_from_proto(self._call("GetCollection", ref))

    def list_collections(self) -> list[CollectionInfo]:
        msg = self._call("ListCollections", client_wire.list_request())
        return [client_wire.collection_from_proto(c) for c in msg.collections]

    def close_collection(self, collection_id: str) -> CollectionInfo:
        ref = client_wire.collection_ref(collection_id)
        return client_wire.collection_from_proto(self._call("CloseCollection", ref))

    def query(
        self,
        collection_id: str,
        attributes: Sequence[str],
        replicates: int = 0,
        reconstruction: str = "",
    ) -> MarginalAnswer:
        """A marginal; ``reconstruction`` "local" (the default) or "global". Its
        per-cell ``variance`` is the mean squared **total** error of the values, noise
        and estimated bias (not noise alone; ``variance_method`` says how), from
        ``replicates`` bootstrap replicates (0: the server's default):
        ``values +- 1.96 sqrt(variance)`` is a ~95% interval (docs/uncertainty.md)."""
        req = client_wire.query_request(collection_id, attributes, replicates, reconstruction)
        return client_wire.marginal_from_proto(self._call("Query", req))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
