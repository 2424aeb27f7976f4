#!/usr/bin/env bash
# Build the Docker image and check what docs/docker.md promises:
#   1. one offline round with the data in a named volume, saved as a checkpoint;
#   2. a second run resumes from the volume's checkpoint (its "resumed" log line) and goes on;
#   3. every process in the container runs as a non-root user;
#   4. `docker stop` (SIGTERM) saves the completed rounds and the node exits 0;
#   5. the image size, against a limit.
# Rounds are shrunk (1 task, 4 completions of 24 tokens) so that it takes minutes on a CPU.
#
# Settings (environment):
#   IMAGE=sapo-node:smoke          the tag to build and test
#   BASE_IMAGE=python:3.11-slim    passed to the build (--build-arg BASE_IMAGE)
#   TORCH_INDEX_URL=...            passed to the build; default: PyTorch's CPU index
#   BUILD_NETWORK=                 docker build --network (e.g. host); empty: Docker's default
#   RUN_NETWORK=none               docker run --network for the node (none or host)
#   MAX_IMAGE_MB=1536              fail if the image is larger
#   STOP_TIMEOUT=120               seconds docker stop waits before SIGKILL
# On a machine that cannot pull from Docker Hub (the project's CI), with /work/shared/docker:
#   bash engine.sh && bash stand-in-base.sh && bash wheel-index.sh
#   BASE_IMAGE=local/python:3.11-slim TORCH_INDEX_URL=http://127.0.0.1:18080/simple \
#     BUILD_NETWORK=host scripts/docker-smoke.sh
set -euo pipefail

IMAGE=${IMAGE:-sapo-node:smoke}
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
BUILD_NETWORK=${BUILD_NETWORK:-}
RUN_NETWORK=${RUN_NETWORK:-none}
MAX_IMAGE_MB=${MAX_IMAGE_MB:-1536}
STOP_TIMEOUT=${STOP_TIMEOUT:-120}

root=$(cd "$(dirname "$0")/.." && pwd)
volume="sapo-smoke-$$"
container="sapo-smoke-$$"
logs=$(mktemp -d)
cleanup() {
    docker rm -f "$container" >/dev/null 2>&1 || true
    docker volume rm "$volume" >/dev/null 2>&1 || true
    rm -rf "$logs"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
# The node's JSON log lines with this event (and, optionally, this field value).
events() { grep -E "\"event\": \"$2\"" "$1" | grep -E "${3:-.}" || true; }

small=(-e 'SAPO_GENERATION__COMPLETIONS_PER_TASK=4' -e 'SAPO_GENERATION__MAX_NEW_TOKENS=24')
node() { # node LOGFILE ARGS...: one attached run of the image on the volume
    local log=$1
    shift
    local started=$SECONDS rc=0
    docker run --rm --network "$RUN_NETWORK" -v "$volume:/data" "${small[@]}" "$IMAGE" \
        --offline --json-logs --local 1 --external 0 "$@" >"$log" 2>&1 || rc=$?
    echo "exit $rc after $((SECONDS - started)) s"
    [ "$rc" -eq 0 ] || { tail -20 "$log" >&2; fail "the node exited $rc"; }
}

step "build $IMAGE (base $BASE_IMAGE, torch from $TORCH_INDEX_URL)"
started=$SECONDS
docker build ${BUILD_NETWORK:+--network "$BUILD_NETWORK"} \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL" \
    -t "$IMAGE" "$root" >"$logs/build" 2>&1 || { tail -30 "$logs/build" >&2; fail "docker build"; }
echo "built in $((SECONDS - started)) s"
docker volume create "$volume" >/dev/null

step "run 1: one offline round (network $RUN_NETWORK, data in volume $volume)"
node "$logs/run1" --rounds 1
[ -n "$(events "$logs/run1" "checkpoint saved" '"round": 1[,}]')" ] || fail "no checkpoint of round 1"
events "$logs/run1" "checkpoint saved"

step "run 2: resumes from the volume's checkpoint"
node "$logs/run2" --rounds 2
resumed=$(events "$logs/run2" resumed '"round": 1[,}]')
[ -n "$resumed" ] || fail "run 2 did not resume from round 1"
echo "$resumed"
[ -n "$(events "$logs/run2" stopped '"rounds_this_run": 1[,}]')" ] || fail "run 2 did not run 1 round"
events "$logs/run2" stopped

step "run 3: non-root, then docker stop saves and exits 0"
docker run -d --name "$container" --network "$RUN_NETWORK" -v "$volume:/data" "${small[@]}" \
    "$IMAGE" --offline --json-logs --local 1 --external 0 >/dev/null
deadline=$((SECONDS + 900))
until docker logs "$container" 2>&1 | grep -q '"event": "round"'; do
    [ "$(docker inspect -f '{{.State.Running}}' "$container")" = true ] ||
        { docker logs "$container" 2>&1 | tail -20 >&2; fail "the node stopped by itself"; }
    [ "$SECONDS" -lt "$deadline" ] || fail "no round within 900 s"
    sleep 2
done
uids=$(docker exec "$container" sh -c 'cat /proc/[0-9]*/status 2>/dev/null; true' | awk '/^Uid:/ {print $2}' | sort -u)
user=$(docker exec "$container" sh -c 'tr "\0" " " </proc/1/cmdline; echo; id')
echo "PID 1: $user"
echo "uids of the container's processes: $(echo $uids)"
for uid in $uids; do [ "$uid" -ne 0 ] || fail "a process runs as root"; done
started=$SECONDS
docker stop -t "$STOP_TIMEOUT" "$container" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$container")
echo "docker stop: exit $code after $((SECONDS - started)) s"
docker logs "$container" >"$logs/run3" 2>&1
[ "$code" -eq 0 ] || { tail -20 "$logs/run3" >&2; fail "exit $code after docker stop"; }
[ -n "$(events "$logs/run3" 'stopping: finishing cleanly [^"]*' SIGTERM)" ] || fail "SIGTERM not seen"
saved=$(events "$logs/run3" "checkpoint saved" | tail -1)
[ -n "$saved" ] || fail "no checkpoint saved on the way out"
echo "$saved"
events "$logs/run3" stopped
latest=$(docker run --rm --network none -v "$volume:/data" --entrypoint cat "$IMAGE" \
    /data/checkpoints/LATEST)
round=$(echo "$saved" | sed -E 's/.*"round": ([0-9]+).*/\1/')
[ "$latest" = "$(printf 'round-%06d' "$round")" ] || fail "LATEST is $latest, not round $round"
echo "volume: checkpoints/LATEST = $latest"
docker run --rm --network none -v "$volume:/data" --entrypoint sh "$IMAGE" -c \
    'cd /data && du -sh checkpoints/round-* models pool.sqlite3 && wc -lc metrics.jsonl'

step "image size"
bytes=$(docker image inspect -f '{{.Size}}' "$IMAGE")
base=$(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" 2>/dev/null || echo 0)
mb=$((bytes / 1000000))
echo "$IMAGE: $mb MB ($BASE_IMAGE: $((base / 1000000)) MB of it; limit $MAX_IMAGE_MB MB)"
[ "$mb" -le "$MAX_IMAGE_MB" ] || fail "the image is larger than $MAX_IMAGE_MB MB"
echo
echo "docker smoke: all checks passed"
