// The placement page's behaviour: zoom (wheel), pan (drag), search by node name (Enter: next
// match), folds (click to open/close, or the buttons), node details (click), the overview
// (bottom right: click or drag to move there). No network.
(function () {
  const svg = document.getElementById("graph"), vp = document.getElementById("viewport");
  const info = document.getElementById("details");
  let s = 1, tx = 0, ty = 0, drag = null, mdrag = false, hits = [], hit = 0;
  const mini = document.getElementById("minimap"), lens = document.getElementById("lens");
  function apply() {
    vp.setAttribute("transform", `translate(${tx},${ty}) scale(${s})`);
    if (lens) {  // the overview's lens: what the main view shows, in the graph's units
      lens.setAttribute("x", -tx / s); lens.setAttribute("y", -ty / s);
      lens.setAttribute("width", svg.clientWidth / s); lens.setAttribute("height", svg.clientHeight / s);
    }
  }
  // fit: the whole graph, however small its text gets (the button); opening: the whole graph
  // when its text stays at full size, else full size (11 px text) from the top, centred on
  // the inputs, with the whole graph one click away.
  function fit() {
    const b = vp.getBBox(), W = svg.clientWidth, H = svg.clientHeight;
    s = Math.min(1, (W - 40) / (b.width || 1), (H - 30) / (b.height || 1));
    tx = (W - b.width * s) / 2 - b.x * s; ty = 16 - b.y * s; apply();
  }
  function opening() {
    fit();
    if (s >= 1) return;
    const b = vp.getBBox(), W = svg.clientWidth;
    s = 1; tx = b.width <= W - 40 ? (W - b.width) / 2 - b.x : 20 - b.x; ty = 16 - b.y; apply();
  }
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = svg.getBoundingClientRect(), mx = e.clientX - r.left, my = e.clientY - r.top;
    const f = Math.exp(-e.deltaY * 0.0015);
    tx = mx - (mx - tx) * f; ty = my - (my - ty) * f; s *= f; apply();
  }, { passive: false });
  svg.addEventListener("mousedown", (e) => { drag = [e.clientX - tx, e.clientY - ty]; });
  window.addEventListener("mousemove", (e) => {
    if (drag) { tx = e.clientX - drag[0]; ty = e.clientY - drag[1]; apply(); }
  });
  window.addEventListener("mouseup", () => { drag = null; mdrag = false; });
  // the overview: a click or drag centres the main view on that point of the graph
  function look(e) {
    const p = mini.createSVGPoint(); p.x = e.clientX; p.y = e.clientY;
    const g = p.matrixTransform(mini.getScreenCTM().inverse());
    tx = svg.clientWidth / 2 - g.x * s; ty = svg.clientHeight / 2 - g.y * s; apply();
  }
  if (mini) {
    mini.addEventListener("mousedown", (e) => { e.preventDefault(); mdrag = true; look(e); });
    mini.addEventListener("mousemove", (e) => { if (mdrag) look(e); });
  }
  function openFold(k, open) {
    const m = document.getElementById("m" + k);
    if (m) m.style.display = (open === undefined ? m.style.display === "none" : open) ? "" : "none";
  }
  document.querySelectorAll(".fold").forEach((f) => f.addEventListener("click", (e) => {
    e.stopPropagation(); openFold(f.dataset.fold);
  }));
  document.getElementById("expand").onclick = () =>
    document.querySelectorAll(".fold").forEach((f) => openFold(f.dataset.fold, true));
  document.getElementById("collapse").onclick = () =>
    document.querySelectorAll(".fold").forEach((f) => openFold(f.dataset.fold, false));
  document.getElementById("fit").onclick = fit;
  function centre(el) {
    const inFold = el.closest(".members");
    if (inFold) inFold.style.display = "";
    const b = el.getBBox(), m = vp.getCTM().inverse().multiply(el.getCTM());
    const cx = m.a * (b.x + b.width / 2) + m.e, cy = m.d * (b.y + b.height / 2) + m.f;
    s = Math.max(s, 0.8); tx = svg.clientWidth / 2 - cx * s; ty = svg.clientHeight / 2 - cy * s;
    apply(); if (el.classList.contains("node")) show(el);
  }
  function show(el) {
    const d = el.dataset;
    info.textContent = `${d.name}\n${d.op} on ${d.device} (partition ${d.partition})\n` +
      `${d.shape || ""}\n${d.reason}`;
  }
  const q = document.getElementById("search"), count = document.getElementById("count");
  q.addEventListener("input", () => {
    const t = q.value.trim().toLowerCase();
    document.querySelectorAll(".node.hit").forEach((n) => n.classList.remove("hit"));
    hits = t ? [...document.querySelectorAll(".node")].filter(
      (n) => n.dataset.name.toLowerCase().includes(t)) : [];
    hits.forEach((n) => n.classList.add("hit"));
    count.textContent = t ? `${hits.length} match${hits.length === 1 ? "" : "es"}` : "";
    hit = 0; if (hits.length) centre(hits[0]);
  });
  q.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && hits.length) { hit = (hit + 1) % hits.length; centre(hits[hit]); }
  });
  document.querySelectorAll(".node").forEach((n) => n.addEventListener("click", (e) => {
    e.stopPropagation(); show(n);
  }));
  document.querySelectorAll("tr[data-partition]").forEach((r) => {
    const band = document.getElementById("p" + r.dataset.partition);
    r.addEventListener("mouseenter", () => band && band.classList.add("lit"));
    r.addEventListener("mouseleave", () => band && band.classList.remove("lit"));
    r.addEventListener("click", () => band && centre(band));
  });
  document.querySelectorAll(".partition").forEach((b) => {
    const row = document.querySelector(`tr[data-partition="${b.dataset.index}"]`);
    b.addEventListener("mouseenter", () => row && row.classList.add("lit"));
    b.addEventListener("mouseleave", () => row && row.classList.remove("lit"));
  });
  opening();
})();
