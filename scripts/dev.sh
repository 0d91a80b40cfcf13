#!/usr/bin/env bash
# Sluice's one entry point for people and CI.
#
#   bash scripts/dev.sh demo      install everything, then run `sluice demo`
#   bash scripts/dev.sh test      install everything, then lint, type-check, check the
#                                 committed Wasm builds, and run the test suite
#   bash scripts/dev.sh install   only install
#   bash scripts/dev.sh kafka-lock  after changing scripts/kafka*/pom.xml: resolve each and write
#                                 the sha256 of every jar to the jars.sha256 beside it
#   bash scripts/dev.sh spark-kafka-lock  the same for scripts/spark/pom.xml (Spark's Kafka
#                                 connector) and scripts/spark/jars.sha256
#   bash scripts/dev.sh kroxylicious-lock  the same for scripts/kroxylicious/pom.xml (the
#                                 benchmark's peer proxy) and its jars.sha256
#
# Installs, pinned: Debian packages (kcat, haproxy, a Java runtime for Spark and Kafka, Maven, gcc and
# libssl-dev for the native batch sealer of builtin:encrypt, Rust with the
# wasm32 standard library and Node.js for the Rust and AssemblyScript filter SDKs) when
# missing, the pinned Go toolchain for the Go SDK (from an installed Go), a virtualenv in .venv with the project and every Python dependency from
# constraints.txt (and py-spy for bench/profile_proxy.py, hash-checked against
# scripts/profiling/requirements.txt), the AssemblyScript compiler from its package-lock.json in .venv/node, and
# the Spark driver's class archive in .venv/share/sluice, and Apache Kafka's jars (Maven
# Central, checked against scripts/kafka/jars.sha256) in .venv/share/kafka/libs, Kafka 3.9's
# broker (scripts/kafka39) in .venv/share/kafka39/libs, Spark's Kafka source and sink
# (checked against scripts/spark/jars.sha256) in .venv/share/spark-kafka/jars, and
# Kroxylicious's (the benchmark's peer proxy; scripts/kroxylicious/jars.sha256) in
# .venv/share/kroxylicious/libs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${SLUICE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

say() { printf '\n==> %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

install_debian_packages() {
  local missing=()
  command -v kcat >/dev/null 2>&1 || missing+=(kcat)
  command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  # javac: the tests compile their Java client (tests/java/ClientProbe.java) against Kafka's jars.
  command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
  # Maven fetches Apache Kafka's jars (the real broker for the tests) from Maven Central.
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
  # Python filters are built in a private mount namespace (filters/build.py, unshare).
  command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
  # Filter SDKs: Debian's rustc (and cargo) with the wasm32-unknown-unknown std (a rustup
  # rustc on PATH usually lacks it), and Node.js + npm for the AssemblyScript compiler.
  local pkg
  # builtin:encrypt's native batch sealer (crypto/batch_seal.c): a C compiler and OpenSSL's
  # headers, linked against the system's libcrypto (AES-NI through its EVP interface).
  # Old Go Kafka clients as Debian ships them (Sarama 1.22, segmentio/kafka-go 0.2: sources in
  # /usr/share/gocode, no compiler), built by tests/e2e/test_old_go_clients.py against Kafka 3.9.
  for pkg in rustc cargo libstd-rust-dev-wasm32 gcc libssl-dev \
      golang-github-shopify-sarama-dev golang-github-segmentio-kafka-go-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_python() {
  "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
    echo "Sluice needs Python 3.11 (found $("$PY" --version))" >&2; exit 2; }
  local stamp="$VENV/.sluice-installed"
  local want
  want="$(cat pyproject.toml constraints.txt scripts/python-filters/requirements.txt \
    scripts/profiling/requirements.txt | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  say "creating $VENV and installing pinned Python packages (first time: a few minutes)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt pip==23.2.1 setuptools==75.8.0 wheel==0.45.1
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,spark,build,aws]"
  # Every record batch's CRC32C is checked: the crc32c module's hardware path is what the
  # benchmarks assume; its software fallback (still C) is slower, so say so where it runs.
  "$VENV/bin/python" -c 'import crc32c, sys
if not crc32c.hardware_based:
    print("warning: crc32c has no hardware CRC32C instruction here: CRC checks run in software", file=sys.stderr)'
  # Python filters' builder (a binary wheel with CPython for WASI inside), sha256-checked.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
    -r scripts/python-filters/requirements.txt
  # py-spy for bench/profile_proxy.py: a binary wheel only (its sdist needs a Rust build).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: -r scripts/profiling/requirements.txt
  echo "$want" > "$stamp"
}

# The AssemblyScript compiler, exactly as filters/sdk/assemblyscript/toolchain/package-lock.json
# pins it, in $VENV/node (filters/build.py looks there).
install_node_tools() {
  local lock="filters/sdk/assemblyscript/toolchain"
  local dest="$VENV/node"
  local stamp="$dest/.sluice-installed"
  local want
  want="$(cat "$lock/package.json" "$lock/package-lock.json" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  say "installing the AssemblyScript compiler into $dest"
  mkdir -p "$dest"
  cp "$lock/package.json" "$lock/package-lock.json" "$dest/"
  (cd "$dest" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" > "$stamp"
}

# Go for the Go filter SDK: the version filters/build.py pins (GO_VERSION). Any Go 1.21 or
# newer fetches it as a toolchain module from the Go module proxy; $VENV/bin/go then points at
# it (filters/build.py looks there first). Without any Go, Go filters cannot be built and
# `filters/build.py --check` says so.
GO_WANT=go1.26.8
install_go() {
  local go
  go="$(command -v go || true)"
  [ -n "$go" ] || go=/usr/local/go/bin/go
  if [ ! -x "$go" ]; then
    echo "warning: no Go toolchain: Go filters cannot be built; install $GO_WANT (see docs/WRITING_FILTERS.md)" >&2
    return 0
  fi
  if [ "$(GOTOOLCHAIN=local "$go" env GOVERSION)" = "$GO_WANT" ]; then
    ln -sf "$go" "$VENV/bin/go"
    return 0
  fi
  say "fetching the $GO_WANT toolchain through the Go module proxy"
  local goroot
  goroot="$(GOTOOLCHAIN="$GO_WANT" "$go" env GOROOT)"
  ln -sf "$goroot/bin/go" "$VENV/bin/go"
}

# QuickJS-ng's C sources for JavaScript filters (filters/build.py, QUICKJS_VERSION): the PyPI
# sdist of `quickjs-ng` bundles them (upstream-quickjs/). Fetched with pip, checked against the
# pinned sha256, and unpacked into $VENV/share/sluice/quickjs-ng-<version>.
QUICKJS_SDIST_VERSION=0.17.0.2
QUICKJS_SDIST_SHA256=43d2e48272208721a7aaea8e3f02d4b9318f12ef20cc4f5421b59d9a470706ef
QUICKJS_DIR_NAME=quickjs-ng-0.17.0
install_quickjs() {
  local dest="$VENV/share/sluice/$QUICKJS_DIR_NAME"
  if [ -f "$dest/.sluice-installed" ] && [ "$(cat "$dest/.sluice-installed")" = "$QUICKJS_SDIST_SHA256" ]; then
    return 0
  fi
  say "fetching QuickJS-ng's sources (PyPI sdist quickjs-ng $QUICKJS_SDIST_VERSION) for JavaScript filters"
  local tmp
  tmp="$(mktemp -d)"
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    --no-build-isolation -d "$tmp" "quickjs-ng==$QUICKJS_SDIST_VERSION"
  local sdist="$tmp/quickjs_ng-$QUICKJS_SDIST_VERSION.tar.gz"
  echo "$QUICKJS_SDIST_SHA256  $sdist" | sha256sum --quiet --strict -c - || {
    echo "$sdist does not match the pinned sha256: not installed" >&2; rm -rf "$tmp"; exit 1; }
  rm -rf "$dest"
  mkdir -p "$dest"
  "$VENV/bin/python" - "$sdist" "$dest" <<'PYEOF'
import sys, tarfile
from pathlib import Path
sdist, dest = sys.argv[1], Path(sys.argv[2])
with tarfile.open(sdist) as tar:
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if member.isfile() and len(parts) == 3 and parts[1] == "upstream-quickjs":
            (dest / parts[2]).write_bytes(tar.extractfile(member).read())
        elif member.isfile() and len(parts) == 2 and parts[1] == "LICENSE":
            (dest / "LICENSE").write_bytes(tar.extractfile(member).read())
PYEOF
  rm -rf "$tmp"
  echo "$QUICKJS_SDIST_SHA256" > "$dest/.sluice-installed"
}

# The Spark driver JVM's class archive (spark_audit/class_archive.py): it fits only the jars
# and the JVM it was recorded with, so it is recorded again after every (re)install of the
# Python packages (the stamp is newer then).
install_class_archive() {
  local archive="$VENV/share/sluice/spark-classes.jsa"
  if [ -f "$archive" ] && [ "$archive" -nt "$VENV/.sluice-installed" ]; then
    return 0
  fi
  say "recording the Spark driver's class archive (once per install: about 40 s)"
  # Only a speed-up: Spark runs without it (each local session then starts 4 s slower).
  "$VENV/bin/python" -m sluice.spark_class_archive --force || \
    echo "warning: no class archive for the Spark driver (see the error above); the audit job runs without it" >&2
}

# A cffi module $1/_$2*.so (built by $1/$2_build.py from $1/$2.c): true when it exists and is
# newer than its sources, $1/$2.c, its build script and any further sources named after them.
native_is_current() {
  local dir="$1" stem="$2" so src
  shift 2
  so="$(ls "$dir"/_"$stem"*.so 2>/dev/null | head -1 || true)"
  [ -n "$so" ] || return 1
  for src in "$dir/$stem.c" "$dir/${stem}_build.py" "$@"; do
    [ "$so" -nt "$src" ] || return 1
  done
}

# Builds the cffi module $1/_$2*.so with `python -m sluice.$1.$2_build`; $3 says what it is,
# $4 what the build needs (in the error that stops the set-up).
build_native() {
  local dir="$1" stem="$2" what="$3" needs="$4"
  say "building $what ($dir/$stem.c)"
  "$VENV/bin/python" -m "sluice.$dir.${stem}_build" || {
    echo "could not build $dir/$stem.c: it needs $needs" >&2
    exit 2; }
}

# builtin:encrypt's native batch sealer, crypto/_batch_seal*.so (cffi API mode against
# libcrypto), rebuilt when missing or older than its sources. Without it the filter would run
# its per-record Python path, several times slower: the set-up fails instead.
build_batch_seal() {
  native_is_current crypto batch_seal && return 0
  local inc
  inc="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  if [ ! -f "$inc/Python.h" ]; then
    say "installing Python's headers (python3.11-dev) for the native batch sealer"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-dev >/dev/null
  fi
  build_native crypto batch_seal "the native batch sealer of builtin:encrypt" \
    "gcc, libssl-dev and Python's headers"
}

# The native record check of codec/records.py, codec/_record_check*.so (cffi API mode, plain
# C): one call per batch vets every record on the filter path; rebuilt when missing or older
# than its sources. Without it the check runs aiokafka's reader (same verdicts, slower).
build_record_check() {
  native_is_current codec record_check codec/lz4_sealed.c && return 0
  build_native codec record_check "the native record check" "gcc and Python's headers"
}

# The pass-through fast path's readers, codec/_passthrough*.so (a CPython extension, plain C):
# every relayed request's header, a Produce request's topic name and the KIP-951 checks of
# Produce and Fetch responses in one call each; rebuilt when missing or older than its
# sources. Without it the Python readers run alone (same answers, more CPU per request).
build_passthrough() {
  native_is_current codec passthrough && return 0
  build_native codec passthrough "the pass-through readers" "gcc and Python's headers"
}

# The native epoch ticker of filters/engine.py, filters/_epoch_ticker*.so (cffi API mode, plain
# C and pthreads): advances wasmtime's epoch without taking the GIL; rebuilt when missing or older
# than its sources. Without it the engine runs its Python ticker (same deadlines, 500 GIL
# wake-ups a second while guests are busy).
build_epoch_ticker() {
  native_is_current filters epoch_ticker && return 0
  build_native filters epoch_ticker "the native epoch ticker" "gcc and Python's headers"
}

# The host's SHA-256 pass for guests with the host_sha256 capability (builtin:rules' hash
# rule), filters/_host_sha256*.so (cffi API mode against libcrypto, SHA-NI where the CPU has
# it); rebuilt when missing or older than its sources. Without it the host does not offer the
# capability and such guests hash in Wasm (same bytes, slower).
build_host_sha256() {
  native_is_current filters host_sha256 && return 0
  build_native filters host_sha256 "the host's SHA-256 pass" \
    "gcc, libssl-dev and Python's headers"
}

# A Sluice-ABI guest's records call in one native crossing (sluice_alloc, the input's write,
# the call and, for host_sha256 guests, the pass), filters/_native_call*.so (cffi API mode,
# plain C); rebuilt when missing or older than its sources. Without it the host makes the call
# step by step through ctypes (same results, more CPU a batch) and does not offer host_sha256.
build_native_call() {
  native_is_current filters native_call && return 0
  build_native filters native_call "the fused records call" "gcc and Python's headers"
}

# Bytecode for the project's own modules, as pip writes it for every package it installs: an
# editable install gets none until an import writes it, and where PYTHONDONTWRITEBYTECODE is
# set (this project's CI machines set it) never, so every process, each Spark Python worker
# included, compiled them from source again (importing the audit job's task code: 0.20 s
# instead of 0.12 s). Only stale files are compiled.
compile_project() {
  "$VENV/bin/python" -m compileall -q -j 0 sluice codec crypto filters proxy spark_audit \
    telemetry_schema transforms
}

# Apache Kafka's jar sets, each a folder scripts/<name>/ with pom.xml and jars.sha256, installed
# in $VENV/share/<name>/libs: "kafka" is 4.4 (the tests' broker, its tools and Java client),
# "kafka39" the 3.9 broker alone (the 3.9 smoke run and the old-client tests). sluice/kafka_broker.py
# knows both folders.
KAFKA_SETS=(kafka kafka39)

# Java 17+ and Maven, or a message saying what is missing (a bare "command not found" from
# deep inside the set-up says nothing about why Java is needed).
need_java_and_maven() {
  local why="Apache Kafka's broker (the tests' real Kafka, \`sluice demo --broker kafka\`)"
  if ! command -v java >/dev/null 2>&1; then
    echo "$why needs Java 17 or newer: no \`java\` on PATH (Debian: apt-get install openjdk-17-jre-headless)" >&2
    exit 2
  fi
  local major
  major="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
  if [ -z "$major" ] || [ "${major%%.*}" -lt 17 ] 2>/dev/null; then
    echo "$why needs Java 17 or newer: \`java\` is version ${major:-unknown}" >&2
    exit 2
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "$why is fetched with Maven: no \`mvn\` on PATH (Debian: apt-get install maven)" >&2
    exit 2
  fi
}

# The jars scripts/$1/pom.xml resolves, copied into $2; Maven checks each download against the
# repository's checksum and fails on a mismatch (-C). Jars the two sets share are downloaded
# once (Maven's local repository).
# The jars the pom $1 resolves, copied into $2, Maven checking each download against the
# repository's checksum (-C).
resolve_pom_jars() {
  rm -rf "$2"
  mvn -B -q -C -Dstyle.color=never -f "$1" dependency:copy-dependencies \
    -DoutputDirectory="$2" -DincludeScope=runtime
}

# One pinned jar set: the jars the pom $1 resolves, installed in $3 after each jar's sha256 is
# checked against the committed lock file $2 and no jar the lock file does not list is found.
# Skipped while the pom, the lock file and the installed jars are those of the last install
# (the stamp beside $3). $4 names the set in messages, $5 is the dev.sh command that rewrites
# the lock file.
install_jar_set() {
  local pom="$1" lock="$2" dest="$3" what="$4" lock_cmd="$5"
  local stamp
  stamp="$(dirname "$dest")/.sluice-installed"
  local want
  want="$(cat "$pom" "$lock" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dest" ]; then
    return 0
  fi
  need_java_and_maven
  say "fetching $what ($pom) from Maven Central into $dest"
  local tmp="$dest.tmp"
  mkdir -p "$(dirname "$dest")"
  resolve_pom_jars "$pom" "$tmp"
  (cd "$tmp" && sha256sum --quiet --strict -c "$ROOT/$lock") || {
    echo "$what in $tmp do not match $lock (see above): not installed" >&2; exit 1; }
  local extra
  extra="$(comm -23 <(ls "$tmp" | sort) <(awk '{print $2}' "$lock" | sort))"
  if [ -n "$extra" ]; then
    echo "Maven resolved jars that $lock does not list: $extra" >&2
    echo "(after changing $pom run: bash scripts/dev.sh $lock_cmd)" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv "$tmp" "$dest"
  echo "$want" > "$stamp"
}

# Writes the lock file $2 from a fresh resolution of the pom $1 (review the diff before
# committing).
write_jar_lock() {
  local tmp
  tmp="$(mktemp -d)"
  resolve_pom_jars "$1" "$tmp/jars"
  (cd "$tmp/jars" && sha256sum -- *.jar) > "$2"
  rm -rf "$tmp"
  say "wrote $2 ($(wc -l < "$2") jars)"
}

# Apache Kafka's jar sets (scripts/kafka, scripts/kafka39) in $VENV/share/<set>/libs
# (sluice/kafka_broker.py starts the broker from them).
install_kafka() {
  local set
  for set in "${KAFKA_SETS[@]}"; do
    install_jar_set "scripts/$set/pom.xml" "scripts/$set/jars.sha256" "$VENV/share/$set/libs" \
      "Apache Kafka's jars" kafka-lock
  done
}

write_kafka_lock() {
  need_java_and_maven
  local set
  for set in "${KAFKA_SETS[@]}"; do
    write_jar_lock "scripts/$set/pom.xml" "scripts/$set/jars.sha256"
  done
}

# The Kafka broker's class archive (sluice/kafka_class_archive.py): it fits only
# the jars and the JVM it was recorded with, so it is recorded again after every (re)install of
# the jars (the stamp is newer then). Measured: a node starts in about 60% of the time and CPU.
install_kafka_class_archive() {
  local archive="$VENV/share/kafka/kafka-classes.jsa"
  if [ -f "$archive" ] && [ "$archive" -nt "$VENV/share/kafka/.sluice-installed" ]; then
    return 0
  fi
  say "recording the Kafka broker's class archive (once per install: about 25 s)"
  # Only a speed-up: Kafka starts without it.
  "$VENV/bin/python" -m sluice.kafka_class_archive || \
    echo "warning: no class archive for the Kafka broker (see the error above); it starts without it" >&2
}

# Spark's Kafka source and sink (the `kafka` format of Structured Streaming, which pyspark's
# wheel lacks) in $VENV/share/spark-kafka/jars, for the streaming query the tests run through
# the proxy (tests/harness/spark_streaming.py loads them with spark.jars: no Ivy, no network at
# run time).
SPARK_KAFKA_POM="scripts/spark/pom.xml"
SPARK_KAFKA_LOCK="scripts/spark/jars.sha256"
install_spark_kafka() {
  install_jar_set "$SPARK_KAFKA_POM" "$SPARK_KAFKA_LOCK" "$VENV/share/spark-kafka/jars" \
    "Spark's Kafka connector" spark-kafka-lock
}

# Kroxylicious's jars (the benchmark's peer proxy, bench/kroxylicious.py) in
# $VENV/share/kroxylicious/libs.
KROX_POM="scripts/kroxylicious/pom.xml"
KROX_LOCK="scripts/kroxylicious/jars.sha256"
install_kroxylicious() {
  install_jar_set "$KROX_POM" "$KROX_LOCK" "$VENV/share/kroxylicious/libs" \
    "Kroxylicious's jars (benchmark peer)" kroxylicious-lock
}

# Python filters build reproducibly only in a private mount namespace on a fresh tmpfs
# (filters/build.py): say now, not at the first build, if this machine refuses one.
check_python_sandbox() {
  "$VENV/bin/python" -c 'import sys; sys.path.insert(0, "filters"); import build
try:
    build.check_py_sandbox()
except build.BuildError as exc:
    sys.exit(f"error: {exc}")'
}

install_all() {
  install_debian_packages
  install_python
  check_python_sandbox
  build_batch_seal
  build_record_check
  build_passthrough
  build_epoch_ticker
  build_host_sha256
  build_native_call
  install_node_tools
  install_kafka
  install_spark_kafka
  install_kroxylicious
  install_go
  install_quickjs
  compile_project
  install_class_archive
  install_kafka_class_archive
}

run_checks() {
  say "ruff"
  "$VENV/bin/ruff" check .
  say "mypy"
  bash scripts/typecheck.sh "$VENV"
  # That the committed Wasm modules match a rebuild from source (filters/build.py --check) is
  # a test of its own, tests/filters/builtin/test_build_check.py: run here as well, it cost
  # CI the same rebuild twice.
}

run_tests() {
  # Three passes: every test but those that measure time on two workers (a test file stays on
  # one worker, so its module fixtures are built once), then those marked `serial` alone, so
  # that no other test shares the machine's cores with them. The slowest tests are listed at
  # the end of each pass, to keep the suite's time in view. Last, the Kafka 3.9 smoke run.
  say "pytest: on two workers, all but the tests marked serial"
  # The tests that need a Kafka 3.9 node (marker kafka39) wait for the smoke run, whose
  # session node is 3.9: one 3.9 start instead of one per worker.
  local no39=""
  [ $# -eq 0 ] && no39=" and not kafka39"
  set +e
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 -n 2 --dist loadfile \
    -m "not soak and not serial$no39" "$@"
  local rc=$?
  say "pytest: the tests marked serial, alone"
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=10 -m "serial and not soak" "$@"
  local rc2=$?
  local rc3=0
  if [ $# -eq 0 ]; then
    # The same clients and filters against Apache Kafka 3.9 (many users still run 3.x): a
    # representative subset, one 3.9 node, tests/harness/kafka39_smoke.py. Not when the
    # command was given its own pytest arguments.
    say "pytest: the Kafka 3.9 smoke run (tests/harness/kafka39_smoke.py)"
    # shellcheck disable=SC2046
    SLUICE_E2E_BROKER=kafka39 "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=5 \
      -m "kafka39_smoke and not soak" $("$VENV/bin/python" -m tests.harness.kafka39_smoke)
    rc3=$?
  fi
  set -e
  # pytest exits 5 when it collected no tests: that is a failure of this command.
  [ $rc -ne 0 ] && return $rc
  [ $rc2 -ne 0 ] && return $rc2
  return $rc3
}

cmd="${1:-}"
shift || true
case "$cmd" in
  install) install_all ;;
  kafka-lock) write_kafka_lock ;;
  spark-kafka-lock) need_java_and_maven; write_jar_lock "$SPARK_KAFKA_POM" "$SPARK_KAFKA_LOCK" ;;
  kroxylicious-lock) need_java_and_maven; write_jar_lock "$KROX_POM" "$KROX_LOCK" ;;
  demo) install_all; exec "$VENV/bin/sluice" demo "$@" ;;
  test) install_all; run_checks; run_tests "$@" ;;
  *) echo "usage: bash scripts/dev.sh {demo|test|install|kafka-lock|spark-kafka-lock|kroxylicious-lock} [args]" >&2; exit 2 ;;
esac
