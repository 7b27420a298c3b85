#!/bin/sh
# Every built man page renders without a word from mandoc -T lint (style
# level included) or groff -ww (all warnings), tables through tbl.
#   test-man.sh PAGE...
# mandoc and groff come from scripts/deps.sh --tests; without them this fails.
status=0
for tool in mandoc groff; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (scripts/deps.sh --tests)" >&2; exit 1; }
done
[ $# -gt 0 ] || { echo "no pages given" >&2; exit 1; }
for page in "$@"; do
  out=$(mandoc -T lint -W style "$page" 2>&1) || status=1
  [ -z "$out" ] || { printf '%s\n' "$out"; status=1; }
  out=$(groff -man -t -ww -z "$page" 2>&1) || status=1
  [ -z "$out" ] || { printf '%s\n' "$out"; status=1; }
  # The page has the sections a reader looks for.
  for section in NAME DESCRIPTION "SEE ALSO"; do
    grep -q "^\.SH \"*$section\"*\$" "$page" || { echo "$page: no $section section" >&2; status=1; }
  done
  [ $status -eq 0 ] && echo "ok: $page"
done
exit $status
