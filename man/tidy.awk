# Tidies the paragraph macros of scdoc (1.11) output so that mandoc -T lint
# has nothing to say and the page renders the same:
#   - ".P" then ".RE" (the end of an indented block) becomes ".RE" then
#     ".P", keeping the blank line between list items;
#   - a ".P" right after .TH/.SH/.SS or another .P, or right before
#     .SH/.SS or the end, starts no paragraph and is dropped (mandoc:
#     "skipping paragraph macro").
{ line[NR] = $0 }
END {
  for (i = 1; i < NR; i++)
    if (line[i] == ".P" && line[i + 1] == ".RE") {
      line[i] = ".RE"
      line[i + 1] = ".P"
    }
  kept = ""
  for (i = 1; i <= NR; i++) {
    if (line[i] == ".P" || line[i] == ".PP") {
      after = i < NR ? line[i + 1] : ""
      if (kept ~ /^\.(TH|SH|SS|P|PP)( |$)/ || after ~ /^\.(SH|SS|P|PP)( |$)/ || i == NR)
        continue
    }
    print line[i]
    kept = line[i]
  }
}
