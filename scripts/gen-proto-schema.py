#!/usr/bin/env python3
"""Derives Capstan's protobuf field table from upstream generated.proto files.

kubectl's typed clients (e.g. `kubectl create service`) send request bodies as Kubernetes
protobuf. Capstan decodes them into JSON with a table of field numbers, names and types taken
from the upstream API definitions. Usage:

    scripts/gen-proto-schema.py OUT.json core/v1/generated.proto meta/v1/generated.proto ...

(The .proto files come from kubernetes/api and kubernetes/apimachinery at the release whose
wire format Capstan targets.) A group's table is crates/resources/src/<group>/protobuf.json:
its own messages and those of other groups they refer to (core/v1's ObjectReference for
discovery/v1); the apimachinery messages every group uses (meta/v1, runtime, resource, intstr)
are crates/machinery/data/proto-apimachinery.json.
"""
import json
import re
import sys

SCALARS = {"string", "int32", "int64", "bool", "bytes", "double", "float", "uint32", "uint64"}
FIELD = re.compile(r"^\s*(optional|repeated)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)")
MAP = re.compile(r"^\s*map<\s*(\w+)\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)")


def resolve(kind, package):
    if kind in SCALARS:
        return kind
    if kind.startswith("."):
        return "m:" + kind[1:]
    return "m:" + package + "." + kind


def parse(path, messages):
    package = ""
    current = None
    depth = 0
    for line in open(path, encoding="utf-8"):
        stripped = line.split("//")[0].strip()
        if stripped.startswith("package "):
            package = stripped[len("package "):].rstrip(";").strip()
        m = re.match(r"^message\s+(\w+)\s*\{", stripped)
        if m and depth == 0:
            current = package + "." + m.group(1)
            messages[current] = []
        depth += stripped.count("{") - stripped.count("}")
        if depth == 0:
            current = None
            continue
        if current is None:
            continue
        f = FIELD.match(stripped)
        if f:
            label, kind, name, number = f.groups()
            messages[current].append([int(number), name, resolve(kind, package), label == "repeated"])
            continue
        f = MAP.match(stripped)
        if f:
            key, value, name, number = f.groups()
            messages[current].append([int(number), name, "map:" + resolve(value, package), False])


def main():
    out, *paths = sys.argv[1:]
    messages = {}
    for path in paths:
        parse(path, messages)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(messages, f, separators=(",", ":"), sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
