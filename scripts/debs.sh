# Sourced by the set-up scripts: `ensure_debs TAG pkg...` installs the Debian packages that
# are missing (with sudo when not root), saying which.
ensure_debs() {
  local tag="$1"; shift
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    local SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "[$tag] installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
