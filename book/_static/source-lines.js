// A source page opened at #L12-L30 (a chapter's "Read the real thing" link): highlight those
// lines and scroll to the first.
function minicbShowLines() {
  const match = /^#L(\d+)(?:-L(\d+))?$/.exec(window.location.hash);
  if (!match) return;
  const first = Number(match[1]);
  const last = Number(match[2] || match[1]);
  document.querySelectorAll(".minicb-shown").forEach((el) => el.classList.remove("minicb-shown"));
  for (let line = first; line <= last; line++) {
    const span = document.getElementById("L" + line);
    if (span) span.classList.add("minicb-shown");
  }
  const start = document.getElementById("L" + first);
  if (start) start.scrollIntoView({ block: "center" });
}
document.addEventListener("DOMContentLoaded", minicbShowLines);
window.addEventListener("hashchange", minicbShowLines);
