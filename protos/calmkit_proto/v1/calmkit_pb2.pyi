from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CollectionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTION_STATE_UNSPECIFIED: _ClassVar[CollectionState]
    COLLECTION_STATE_OPEN: _ClassVar[CollectionState]
    COLLECTION_STATE_CLOSED: _ClassVar[CollectionState]
COLLECTION_STATE_UNSPECIFIED: CollectionState
COLLECTION_STATE_OPEN: CollectionState
COLLECTION_STATE_CLOSED: CollectionState

class Attribute(_message.Message):
    __slots__ = ("name", "categories", "ordered")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    ORDERED_FIELD_NUMBER: _ClassVar[int]
    name: str
    categories: _containers.RepeatedScalarFieldContainer[str]
    ordered: bool
    def __init__(self, name: _Optional[str] = ..., categories: _Optional[_Iterable[str]] = ..., ordered: _Optional[bool] = ...) -> None: ...

class Schema(_message.Message):
    __slots__ = ("attributes",)
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.RepeatedCompositeFieldContainer[Attribute]
    def __init__(self, attributes: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ...) -> None: ...

class View(_message.Message):
    __slots__ = ("attributes",)
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, attributes: _Optional[_Iterable[int]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("schema", "epsilon", "views", "oracles", "shares", "seed", "digest")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    ORACLES_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    schema: Schema
    epsilon: float
    views: _containers.RepeatedCompositeFieldContainer[View]
    oracles: _containers.RepeatedScalarFieldContainer[str]
    shares: _containers.RepeatedScalarFieldContainer[float]
    seed: int
    digest: str
    def __init__(self, schema: _Optional[_Union[Schema, _Mapping]] = ..., epsilon: _Optional[float] = ..., views: _Optional[_Iterable[_Union[View, _Mapping]]] = ..., oracles: _Optional[_Iterable[str]] = ..., shares: _Optional[_Iterable[float]] = ..., seed: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("view", "cell", "bits", "report_id", "pseudonym", "ticket")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    CELL_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    PSEUDONYM_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    view: int
    cell: int
    bits: bytes
    report_id: bytes
    pseudonym: bytes
    ticket: bytes
    def __init__(self, view: _Optional[int] = ..., cell: _Optional[int] = ..., bits: _Optional[bytes] = ..., report_id: _Optional[bytes] = ..., pseudonym: _Optional[bytes] = ..., ticket: _Optional[bytes] = ...) -> None: ...

class ReportBatch(_message.Message):
    __slots__ = ("collection_id", "plan_digest", "reports")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    collection_id: str
    plan_digest: str
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    def __init__(self, collection_id: _Optional[str] = ..., plan_digest: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ...) -> None: ...

class ColumnarBatch(_message.Message):
    __slots__ = ("collection_id", "plan_digest", "count", "views", "cells", "bits", "report_ids", "pseudonyms", "tickets")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    REPORT_IDS_FIELD_NUMBER: _ClassVar[int]
    PSEUDONYMS_FIELD_NUMBER: _ClassVar[int]
    TICKETS_FIELD_NUMBER: _ClassVar[int]
    collection_id: str
    plan_digest: str
    count: int
    views: bytes
    cells: bytes
    bits: bytes
    report_ids: bytes
    pseudonyms: bytes
    tickets: bytes
    def __init__(self, collection_id: _Optional[str] = ..., plan_digest: _Optional[str] = ..., count: _Optional[int] = ..., views: _Optional[bytes] = ..., cells: _Optional[bytes] = ..., bits: _Optional[bytes] = ..., report_ids: _Optional[bytes] = ..., pseudonyms: _Optional[bytes] = ..., tickets: _Optional[bytes] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("accepted", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("collection_id", "schema", "epsilon", "expected_n", "k", "theta", "views", "m", "l", "seed", "planner", "pilot", "reconstruction", "admission", "max_reports")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_N_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    L_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PLANNER_FIELD_NUMBER: _ClassVar[int]
    PILOT_FIELD_NUMBER: _ClassVar[int]
    RECONSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    MAX_REPORTS_FIELD_NUMBER: _ClassVar[int]
    collection_id: str
    schema: Schema
    epsilon: float
    expected_n: int
    k: int
    theta: float
    views: _containers.RepeatedCompositeFieldContainer[View]
    m: int
    l: int
    seed: int
    planner: str
    pilot: float
    reconstruction: str
    admission: Admission
    max_reports: int
    def __init__(self, collection_id: _Optional[str] = ..., schema: _Optional[_Union[Schema, _Mapping]] = ..., epsilon: _Optional[float] = ..., expected_n: _Optional[int] = ..., k: _Optional[int] = ..., theta: _Optional[float] = ..., views: _Optional[_Iterable[_Union[View, _Mapping]]] = ..., m: _Optional[int] = ..., l: _Optional[int] = ..., seed: _Optional[int] = ..., planner: _Optional[str] = ..., pilot: _Optional[float] = ..., reconstruction: _Optional[str] = ..., admission: _Optional[_Union[Admission, _Mapping]] = ..., max_reports: _Optional[int] = ...) -> None: ...

class Admission(_message.Message):
    __slots__ = ("scheme", "key")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    scheme: str
    key: bytes
    def __init__(self, scheme: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class Collection(_message.Message):
    __slots__ = ("collection_id", "state", "plan", "k", "reports", "view_reports", "created_at", "closed_at", "submit_token", "phase", "phase_reports", "pilot_target", "admission", "max_reports", "flags", "pilot_check", "expected_n")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    VIEW_REPORTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    PILOT_TARGET_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    MAX_REPORTS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    PILOT_CHECK_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_N_FIELD_NUMBER: _ClassVar[int]
    collection_id: str
    state: CollectionState
    plan: Plan
    k: int
    reports: int
    view_reports: _containers.RepeatedScalarFieldContainer[int]
    created_at: float
    closed_at: float
    submit_token: str
    phase: int
    phase_reports: _containers.RepeatedScalarFieldContainer[int]
    pilot_target: int
    admission: str
    max_reports: int
    flags: _containers.RepeatedScalarFieldContainer[str]
    pilot_check: str
    expected_n: int
    def __init__(self, collection_id: _Optional[str] = ..., state: _Optional[_Union[CollectionState, str]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., k: _Optional[int] = ..., reports: _Optional[int] = ..., view_reports: _Optional[_Iterable[int]] = ..., created_at: _Optional[float] = ..., closed_at: _Optional[float] = ..., submit_token: _Optional[str] = ..., phase: _Optional[int] = ..., phase_reports: _Optional[_Iterable[int]] = ..., pilot_target: _Optional[int] = ..., admission: _Optional[str] = ..., max_reports: _Optional[int] = ..., flags: _Optional[_Iterable[str]] = ..., pilot_check: _Optional[str] = ..., expected_n: _Optional[int] = ...) -> None: ...

class CollectionRef(_message.Message):
    __slots__ = ("collection_id",)
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    collection_id: str
    def __init__(self, collection_id: _Optional[str] = ...) -> None: ...

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectionList(_message.Message):
    __slots__ = ("collections",)
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedCompositeFieldContainer[Collection]
    def __init__(self, collections: _Optional[_Iterable[_Union[Collection, _Mapping]]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("collection_id", "attributes", "replicates", "reconstruction")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    REPLICATES_FIELD_NUMBER: _ClassVar[int]
    RECONSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    collection_id: str
    attributes: _containers.RepeatedScalarFieldContainer[str]
    replicates: int
    reconstruction: str
    def __init__(self, collection_id: _Optional[str] = ..., attributes: _Optional[_Iterable[str]] = ..., replicates: _Optional[int] = ..., reconstruction: _Optional[str] = ...) -> None: ...

class MarginalTable(_message.Message):
    __slots__ = ("attributes", "shape", "values", "variance", "method", "residual", "reports", "state", "variance_method", "replicates", "flags", "max_shift_per_share")
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_METHOD_FIELD_NUMBER: _ClassVar[int]
    REPLICATES_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MAX_SHIFT_PER_SHARE_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.RepeatedScalarFieldContainer[str]
    shape: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    variance: _containers.RepeatedScalarFieldContainer[float]
    method: str
    residual: float
    reports: int
    state: CollectionState
    variance_method: str
    replicates: int
    flags: _containers.RepeatedScalarFieldContainer[str]
    max_shift_per_share: float
    def __init__(self, attributes: _Optional[_Iterable[str]] = ..., shape: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., variance: _Optional[_Iterable[float]] = ..., method: _Optional[str] = ..., residual: _Optional[float] = ..., reports: _Optional[int] = ..., state: _Optional[_Union[CollectionState, str]] = ..., variance_method: _Optional[str] = ..., replicates: _Optional[int] = ..., flags: _Optional[_Iterable[str]] = ..., max_shift_per_share: _Optional[float] = ...) -> None: ...
