# Sourced first by the device calls that run from the repository root (training/device_suite.sh,
# benchmarks/device_check.sh), after they set LOG: the log under $OUT (tee'd as the call goes, so a timeout
# still brings it back), `say` for timed section headers, and the serving wheels carried in .whl/ (the device
# has no fastapi / pydantic / uvicorn) installed to /tmp/site and put on PYTHONPATH beside this checkout.
OUT=${OUT:?set OUT to the folder that comes back}
PY=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
T0=$(date +%s)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$LOG") 2>&1
say() { echo "== $* (t=$(( $(date +%s) - T0 )) s)"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
