package chattemplate_test

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// TestConcurrentRenders renders all reference conversations from many goroutines through one Template
// per model (run under -race by make test-race) and checks every output.
func TestConcurrentRenders(t *testing.T) {
	convs := loadConversations(t)
	type job struct {
		model string
		body  []byte
		want  string
	}
	var jobs []job
	for _, m := range models {
		for _, c := range convs {
			want := string(readFile(t, filepath.Join("testdata/renders_py", m, c.Name+".txt")))
			if len(want) > 6 && want[:6] == "ERROR:" {
				continue
			}
			jobs = append(jobs, job{m, requestBody(t, c, true), want})
		}
	}
	tmpls := map[string]*chattemplate.Template{}
	for _, m := range models {
		tmpls[m] = newTemplate(t, m)
	}
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8*len(jobs))
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				for i := range jobs {
					j := jobs[(i+g)%len(jobs)]
					got, err := tmpls[j.model].Render(j.body)
					if err != nil || got != j.want {
						errs <- j.model
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for m := range errs {
		t.Errorf("concurrent render of %s differs", m)
	}
}
