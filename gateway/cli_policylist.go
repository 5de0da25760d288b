package gateway

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/gateway/internal/route"
)

// policyListTable renders GET /admin/v1/policies for humans: what the asked gateway serves per model and
// the versions it has loaded, then the fleet's view per model — the activation stack (oldest first, the
// configured policy at the bottom), each gateway with a live report and the version it serves, and the
// gateways that disagree with the stack's top, with the cause. Versions are shortened to 12 hex digits.
func policyListTable(out io.Writer, r admin.ListResponse) {
	var w bytes.Buffer
	defer func() { // tabwriter pads every cell a tab ends: drop the trailing blanks
		for _, l := range strings.SplitAfter(w.String(), "\n") {
			if l != "" {
				io.WriteString(out, strings.TrimRight(l, " \n")+"\n")
			}
		}
	}()
	short := func(v string) string { return route.ShortVersion(v) }
	tw := tabwriter.NewWriter(&w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "THIS GATEWAY SERVES\t\t")
	fmt.Fprintln(tw, "  MODEL\tVERSION\tCONFIG")
	for _, m := range sortedKeys(r.Active) {
		a := r.Active[m]
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", m, short(string(a.Version)), compact(a.Config))
	}
	tw.Flush()
	fmt.Fprintln(&w)
	fmt.Fprintln(tw, "LOADED HERE\t\t\t")
	fmt.Fprintln(tw, "  VERSION\tBYTES\tACTIVE FOR\tNOTE")
	for _, v := range r.Versions {
		var note []string
		if v.Builtin {
			note = append(note, "built in")
		}
		if v.Disabled {
			note = append(note, "disabled (missed deadlines)")
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\n", short(string(v.Version)), v.SizeBytes, dash(strings.Join(v.ActiveFor, ",")), strings.Join(note, ", "))
	}
	tw.Flush()
	if r.Fleet == nil {
		fmt.Fprintln(&w, "\nFLEET: not reported (a gateway without a shared store view)")
		return
	}
	for _, m := range sortedKeys(r.Fleet) {
		f := r.Fleet[m]
		fmt.Fprintf(&w, "\nFLEET %s: active %s\n", m, short(string(f.Active)))
		fmt.Fprintln(tw, "  STACK\tVERSION\tCONFIG\t")
		for i, e := range f.Stack {
			var role []string
			if i == 0 {
				role = append(role, "configured (floor)")
			}
			if i == len(f.Stack)-1 {
				role = append(role, "active")
			} else if i == len(f.Stack)-2 {
				role = append(role, "rollback target")
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", i, short(string(e.Version)), compact(e.Config), strings.Join(role, ", "))
		}
		tw.Flush()
		fmt.Fprintln(tw, "  GATEWAY\tSERVING\tSTATUS\t")
		for _, id := range sortedKeys(f.Gateways) {
			g := f.Gateways[id]
			status := "ok"
			if g.Serving != string(f.Active) || g.Error != "" {
				status = "disagrees"
				if g.Error != "" {
					status += ": " + g.Error
				}
				if g.Attempts > 0 {
					status += fmt.Sprintf(" (%d attempts", g.Attempts)
					if g.NextAttempt != "" {
						status += ", next " + g.NextAttempt
					}
					status += ")"
				}
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", id, short(g.Serving), status)
		}
		tw.Flush()
		switch n := len(f.Disagree); {
		case len(f.Gateways) == 0:
			fmt.Fprintln(&w, "  no gateway has reported yet")
		case n == 0:
			fmt.Fprintf(&w, "  all %d gateways serve %s\n", len(f.Gateways), short(string(f.Active)))
		default:
			ids := make([]string, 0, n)
			for _, d := range f.Disagree {
				ids = append(ids, d.Gateway)
			}
			fmt.Fprintf(&w, "  %d of %d gateways disagree: %s\n", n, len(f.Gateways), strings.Join(ids, ", "))
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// compact returns a JSON config on one line ("null" when empty).
func compact(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if s == "" {
		return "null"
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
