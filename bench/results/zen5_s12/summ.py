import json,glob,sys
for f in sorted(glob.glob(sys.argv[1])):
    try: tests=json.load(open(f))
    except Exception: continue
    for t in tests:
        if t['n_gen']>0:
            print(f.split('/')[3], f.split('/')[-1], 'mean %.2f median %.2f'%(t['avg_ts'], t['median_token_ts']), [round(x) for x in t['samples_token_ms']])
        else:
            print(f.split('/')[3], f.split('/')[-1], t['test'], '%.2f cpu %.2f'%(t['avg_ts'], t['samples_cpu_ts'][0]))
