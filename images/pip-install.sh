#!/bin/sh
# The install step every recipe shares (images/build.sh puts this file in the build context): refuse a base
# whose Python is not the recipe's, then pip-install the arguments with the build's pip cache and CA bundle
# (the build arguments PIP_CACHE_DIR and PIP_CERT; unset, a cache in /tmp) and leave no cache in the image.
#
#   pip-install.sh PYTHON PACKAGE...      PYTHON: the major.minor the recipe declares ("": any)
set -eu
want=$1
shift
if [ -n "$want" ]; then
  python3 -c "import sys; have = '%d.%d' % sys.version_info[:2]; want = sys.argv[1]; sys.exit(None if have == want \
else 'the base image has Python ' + have + ', the recipe declares ' + want + ': pass a base with Python ' + want)" "$want"
fi
python3 -m pip install --no-compile --disable-pip-version-check \
  --cache-dir "${PIP_CACHE_DIR:-/tmp/pip-cache}" ${PIP_CERT:+--cert "$PIP_CERT"} "$@"
rm -rf /tmp/pip-cache
