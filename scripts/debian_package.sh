#!/usr/bin/env bash
# debian_package.sh COMMAND PACKAGE [APT-GET INSTALL OPTION...]
#
# Make COMMAND available by installing Debian's PACKAGE when it is not on PATH
# (./dev's chromium for the browser tests, prometheus for the system metrics).
#
# Exit status: 0 COMMAND is there (found, or installed now); 1 the install
# failed (apt-get's last lines on stderr); 2 it cannot be installed here (not
# root, or no apt-get).
#
# One install at a time on the machine: two checkouts set up at once (a
# ./dev test beside another, on a fresh machine) ran apt-get together, the
# second found dpkg's lock taken, gave up, and its run skipped the browser
# tests. Each install now holds a machine-wide lock (flock on XMC_APT_LOCK,
# default the temp folder's xmc-apt-install.lock) and looks for COMMAND again
# once it has it: whoever waited finds what the first one installed. apt-get
# itself also waits for dpkg's lock (DPkg::Lock::Timeout) when some other
# program holds it.
set -euo pipefail
command=$1 package=$2
shift 2
command -v "$command" >/dev/null 2>&1 && exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  exit 2
fi
exec 9>>"${XMC_APT_LOCK:-${TMPDIR:-/tmp}/xmc-apt-install.lock}"
if ! flock -n 9; then
  echo "dev: waiting for another checkout's install of Debian's packages" >&2
  flock -w 1200 9 || { echo "dev: waited 20 minutes for another install; not installing $package" >&2; exit 1; }
fi
command -v "$command" >/dev/null 2>&1 && exit 0
echo "dev: installing Debian's $package" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
wait_lock=(-o DPkg::Lock::Timeout=600)
if apt-get "${wait_lock[@]}" update -qq >"$log" 2>&1 \
  && DEBIAN_FRONTEND=noninteractive apt-get "${wait_lock[@]}" install -y -qq "$@" "$package" >>"$log" 2>&1 \
  && command -v "$command" >/dev/null 2>&1; then
  exit 0
fi
tail -n 5 "$log" >&2
exit 1
