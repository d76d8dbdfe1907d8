"""calmkit_proto: the wire format (generated protobuf classes live in v1/)."""
