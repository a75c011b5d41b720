"""test_routes.py - the server's route table (ddpmd serve --routes) and openapi.yaml's paths list
the same METHOD PATH pairs, so the contract never promises a route that is not there or hides
one that is; and every `example` in openapi.yaml (a media type's, a parameter's, a header's, a
schema's) is valid against the schema beside it. Usage: test_routes.py PATH/TO/ddpmd
"""
import subprocess
import sys

import jsonschema

from serverlib import OPENAPI, check


def examples(node, where):
    """(where, example, schema) for every object holding both an example and a schema (a
    media type, parameter or header), and every schema with an example"""
    if isinstance(node, dict):
        if "example" in node and "schema" in node:
            yield where, node["example"], node["schema"]
        elif "example" in node and ("type" in node or "properties" in node):
            yield where, node["example"], {k: v for k, v in node.items() if k != "example"}
        for k, v in node.items():
            if k != "example":
                yield from examples(v, where + "/" + str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from examples(v, "%s/%d" % (where, i))

METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def main(exe):
    out = subprocess.run([exe, "serve", "--routes"], capture_output=True, check=True, timeout=30)
    served = sorted(tuple(l.split(" ", 1)) for l in out.stdout.decode().splitlines() if l)
    documented = sorted((m.upper(), path) for path, ops in OPENAPI["paths"].items()
                        for m in ops if m in METHODS)
    check(served, "no routes printed")
    check(served == documented, "served but not in openapi.yaml: %s; in openapi.yaml but not served: %s"
          % (sorted(set(served) - set(documented)), sorted(set(documented) - set(served))))
    n = 0
    for where, ex, schema in examples(OPENAPI, ""):
        full = dict(schema, components=OPENAPI["components"])
        try:
            jsonschema.Draft202012Validator(full).validate(ex)
        except jsonschema.ValidationError as e:
            check(False, "the example at %s is not valid: %s at %s" % (where, e.message,
                                                                     list(e.absolute_path)))
        n += 1
    check(n >= 8, "only %d examples found" % n)
    print("test_routes: ok (%d routes, %d examples)" % (len(served), n))


if __name__ == "__main__":
    main(sys.argv[1])
