"""Checks META.json against the PGXN meta spec 1.0.0 (the parts a release
needs) and against the tree: the version is VERSION's, every provided file
exists, PostgreSQL 15 is the lowest supported server (docs/installation.md).
Exits non-zero with the list of problems."""
import json
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parents[2]
meta = json.loads((root / "META.json").read_text())
version = (root / "VERSION").read_text().strip()
problems = []
semver = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z-]+)?$")
licenses = {"agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd", "gfdl_1_2",
            "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit", "mozilla_1_0", "mozilla_1_1",
            "openssl", "perl_5", "postgresql", "qpl_1_0", "ssleay", "sun", "zlib", "open_source", "restricted",
            "unrestricted", "unknown"}

for field in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
    if field not in meta:
        problems.append(f"missing required field {field}")
if meta.get("meta-spec", {}).get("version") != "1.0.0":
    problems.append("meta-spec.version is not 1.0.0")
if not re.fullmatch(r"[A-Za-z0-9_-]{2,}", meta.get("name", "")):
    problems.append("name must be 2+ characters of letters, digits, _ and -")
if not semver.match(meta.get("version", "")):
    problems.append("version is not a semantic version")
if meta.get("version") != version:
    problems.append(f"version {meta.get('version')} is not VERSION's {version}")
lic = meta.get("license")
if not (lic in licenses or isinstance(lic, dict) or (isinstance(lic, list) and all(x in licenses for x in lic))):
    problems.append(f"license {lic!r} is not one of the spec's strings")
if meta.get("release_status", "stable") not in ("stable", "testing", "unstable"):
    problems.append("release_status must be stable, testing or unstable")
for name, ext in meta.get("provides", {}).items():
    if not semver.match(ext.get("version", "")):
        problems.append(f"provides.{name}.version is not a semantic version")
    if ext.get("version") != version:
        problems.append(f"provides.{name}.version is not VERSION's {version}")
    for key in ("file", "docfile"):
        if key in ext and not (root / ext[key]).is_file():
            problems.append(f"provides.{name}.{key} {ext[key]} does not exist")
    control = root / "extension" / f"{name}.control"
    if not control.is_file():
        problems.append(f"provides.{name}: no extension/{name}.control")
for phase in meta.get("prereqs", {}).values():
    for relation in phase.values():
        for prereq, wanted in relation.items():
            if not semver.match(str(wanted)) and wanted != 0:
                problems.append(f"prereq {prereq}: {wanted!r} is not a version")
if meta.get("prereqs", {}).get("runtime", {}).get("requires", {}).get("PostgreSQL") != "15.0.0":
    problems.append("prereqs.runtime.requires.PostgreSQL is not 15.0.0 (the lowest supported version)")

if problems:
    print("META.json:", *problems, sep="\n  ")
    sys.exit(1)
print(f"META.json: PGXN meta spec 1.0.0, version {version}, ok")
