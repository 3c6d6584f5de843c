// The buyer pages' little script (shop/). Everything works without it: the
// seats are checkboxes in a form, and a waiting purchase page reloads itself.
// With it: Enter toggles a seat too, the choice is summed up, the quantity
// steps aside while seats are ticked, the hold counts down, and each new
// status of a purchase is announced once to screen readers.
(function () {
  "use strict";

  function seatMap(form) {
    var seats = form.querySelectorAll("input.seat-input");
    var quantity = form.querySelector("input[name=quantity]");
    var summary = form.querySelector("[data-selection]");

    function update() {
      var chosen = [];
      seats.forEach(function (seat) { if (seat.checked) chosen.push(seat.value); });
      if (summary) {
        summary.textContent = chosen.length
          ? "Chosen: " + chosen.join(", ") + " (" + chosen.length + " seat" + (chosen.length === 1 ? "" : "s") + ")"
          : "";
      }
      if (quantity) {
        // Seats or a quantity, never both (the API's rule, which the server
        // holds the form to): a disabled field is not sent.
        quantity.disabled = chosen.length > 0;
      }
    }

    seats.forEach(function (seat) {
      seat.addEventListener("change", update);
      seat.addEventListener("keydown", function (event) {
        // Enter on a seat ticks it, as Space does, instead of sending the form.
        if (event.key === "Enter" && !seat.disabled) {
          event.preventDefault();
          seat.click();
        }
      });
    });
    update();
  }

  function countdowns(root) {
    root.querySelectorAll("[data-hold-countdown]").forEach(function (hold) {
      var until = Date.parse(hold.dataset.expiresAt);
      var text = hold.querySelector("[data-countdown-text]");
      if (!text || isNaN(until) || hold.dataset.ticking) return;
      hold.dataset.ticking = "yes";
      function tick() {
        if (!document.body.contains(hold)) return;  // replaced by a newer status
        var left = Math.max(0, Math.round((until - Date.now()) / 1000));
        var minutes = Math.floor(left / 60);
        var seconds = left % 60;
        text.textContent = left > 0
          ? " (" + minutes + " min " + (seconds < 10 ? "0" : "") + seconds + " s left)"
          : " (the hold has run out; we are settling it)";
        if (left > 0) window.setTimeout(tick, 1000);
      }
      tick();
    });
  }

  var lastStatus = null;

  function announce() {
    var announcer = document.querySelector("[data-status-announcer]");
    var status = document.querySelector("[data-purchase-status]");
    if (!announcer || !status) return;
    var value = status.getAttribute("data-purchase-status");
    if (lastStatus !== null && value !== lastStatus) {
      var sentence = document.querySelector("[data-status-sentence]");
      announcer.textContent = status.textContent + ". " + (sentence ? sentence.textContent : "");
    }
    lastStatus = value;
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-seat-map-form]").forEach(seatMap);
    countdowns(document);
    announce();
    var problem = document.getElementById("problem");
    if (problem) problem.focus();
  });

  // The purchase's live part was replaced (htmx, after a 200 to its poll).
  document.addEventListener("htmx:afterSettle", function (event) {
    countdowns(document);
    announce();
  });
})();
