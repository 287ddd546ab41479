"""What a deployment stands on, on this machine: processes handoff starts and records, leased
loopback ports, the services' command lines, Dynamo's discovery entries, and what the machine
has."""
