package server

import "testing"

// A Responses stream ends with response.completed / response.incomplete and fails with response.failed or
// error, named on the event line or (a server that sends none) in the data line, split across reads or
// not; a chat stream is not read for Responses markers.
func TestStreamScanResponses(t *testing.T) {
	for _, tc := range []struct {
		reads            []string
		responses        bool
		finished, failed bool
	}{
		{[]string{"event: response.created\ndata: {}\n\n", "event: response.comp", "leted\ndata: {}\n\n"}, true, true, false},
		{[]string{`data: {"type":"response.output_text.delta"}` + "\n\n", `data: {"type": "response.incomplete"}` + "\n\n"}, true, true, false},
		{[]string{`data: {"type":"response.failed","response":{}}` + "\n\n"}, true, false, true},
		{[]string{"event: error\ndata: {\"type\":\"error\"}\n\n"}, true, false, true},
		{[]string{`data: {"type":"response.output_text.delta"}` + "\n\n"}, true, false, false},
		{[]string{`data: {"type":"response.completed"}` + "\n\n"}, false, false, false},
	} {
		sc := streamScan{responses: tc.responses}
		for _, r := range tc.reads {
			sc.scan([]byte(r))
		}
		if sc.finished() != tc.finished || sc.sawError != tc.failed {
			t.Errorf("%q (responses %v): finished %v error %v", tc.reads, tc.responses, sc.finished(), sc.sawError)
		}
	}
}
